package imp.spark

import scala.collection.mutable
import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.analysis.AnalysisContext
import org.apache.spark.sql.catalyst.expressions._
import org.apache.spark.sql.catalyst.expressions.codegen.{CodegenContext, EmptyBlock, ExprCode, FalseLiteral, TrueLiteral}
import org.apache.spark.sql.catalyst.plans.logical._
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.delta.files.TahoeLogFileIndex
import org.apache.spark.sql.execution.datasources.HadoopFsRelation
import org.apache.spark.sql.types._
import org.slf4j.LoggerFactory

/**
 * Always true: marks a filter the rule added (so a plan is never restricted twice) and names the sketch version
 * in EXPLAIN (`imp_sketch(top, v12)`). Deterministic and not foldable, so it survives optimization beside the
 * range predicate, which Delta's data skipping and Parquet's row-group filters use.
 */
case class SketchTag(sketch: String, version: Long) extends LeafExpression {
  override def nullable: Boolean = false
  override def dataType: DataType = BooleanType
  override def foldable: Boolean = false
  override def eval(input: InternalRow): Any = true
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode =
    ev.copy(code = EmptyBlock, isNull = FalseLiteral, value = TrueLiteral)
  override def toString: String = s"imp_sketch($sketch, v$version)"
  override def sql: String = s"imp_sketch('$sketch', $version)"
}

/** A check that failed (why a sketch is not applied to a subtree), or what to apply. */
sealed trait Verdict
final case class Refused(reason: String) extends Verdict
final case class Applies(manifest: Manifest, location: String, scans: Seq[DeltaScan]) extends Verdict

/** Settings read from the session (`spark.imp.sketches.*`). */
object RuleConf {
  val Enabled = "spark.imp.sketches.enabled"
  val Location = "spark.imp.sketches.location"
  val Refresh = "spark.imp.sketches.refreshSeconds"
  /** `<sketch id>:<version>,...`: versions just published that the cached manifests may not hold yet (imp sets
   * it around its own queries, so a query right after a lazy maintenance sees the version it committed). */
  val Expect = "spark.imp.sketches.expect"
  val DefaultDir = "_imp_sketches"

  def expected(session: SparkSession): Seq[(Long, Long)] =
    session.conf.getOption(Expect).toSeq.flatMap(_.split(",")).map(_.trim).filter(_.nonEmpty).flatMap { x =>
      x.split(":") match {
        case Array(id, v) => scala.util.Try((id.trim.toLong, v.trim.toLong)).toOption
        case _ => None
      }
    }
}

/**
 * The optimizer-side half of sketch use: for an analyzed plan, find the subtrees whose signature equals a
 * published sketch's and that pass every check, and add the sketch's ranges on the Delta scans inside them.
 * Runs as a post-hoc resolution rule (after Delta turned its tables into file-index scans, before the optimizer
 * reshapes the plan). Anything unexpected leaves the plan as it was and logs one line.
 */
class SketchRule(session: SparkSession) extends Rule[LogicalPlan] {
  private val ruleLog = LoggerFactory.getLogger("imp.spark.SketchRule")

  override def apply(plan: LogicalPlan): LogicalPlan = {
    if (!enabled || nested) return plan
    try {
      val started = System.nanoTime()
      val out = rewrite(plan)
      if (ruleLog.isDebugEnabled) ruleLog.debug(s"imp: sketch rule took ${(System.nanoTime() - started) / 1000} us")
      out
    } catch {
      case NonFatal(t) =>
        ruleLog.warn(s"imp: sketch rule left the plan unchanged: ${t.getClass.getSimpleName}: ${t.getMessage}")
        plan
    }
  }

  private def enabled: Boolean = session.conf.get(RuleConf.Enabled, "true").toBoolean

  /** Subquery and view bodies are analyzed on their own first; the enclosing query is matched whole instead. */
  private def nested: Boolean = {
    val ctx = AnalysisContext.get
    ctx.outerPlan.isDefined || ctx.nestedViewDepth > 0
  }

  private def rewrite(plan: LogicalPlan): LogicalPlan = {
    val scans = Matching.deltaScans(plan)
    if (scans.isEmpty || Matching.alreadyApplied(plan)) return plan
    val candidates = Matching.manifests(session, scans.map(_.path))
    val byId = scans.map(_.tableId).toSet
    val relevant = candidates.filter { case (m, _) => m.tables.exists(t => byId(t.id)) }
    if (relevant.isEmpty) return plan
    val enc = new Encoder
    enc.encode(plan)
    val bySig = relevant.groupBy(_._1.signature.getOrElse(""))
    val counts = Matching.scanCounts(plan)
    val defs = Matching.cteDefs(plan)
    var out = plan
    val done = java.util.Collections.newSetFromMap(new java.util.IdentityHashMap[AnyRef, java.lang.Boolean]())
    // top-down: the outermost matching subtree wins, and nothing inside it is matched again
    def visit(p: LogicalPlan): Unit = {
      if (done.contains(p)) return
      val e = enc.encodingOf(p)
      val verdict = e.flatMap(x => bySig.get(x.hash)).flatMap { ms =>
        ms.iterator.map { case (m, loc) => Matching.check(session, m, loc, p, e.get, counts, defs) }
          .collectFirst { case a: Applies => a }
      }
      verdict match {
        case Some(a) =>
          out = Matching.applyTo(out, p, a)
          ruleLog.info(Matching.describe(a))
          Applications.record(a.location, session.sessionState.newHadoopConf(), a.manifest.sketch,
            a.manifest.version)
          done.add(p)
        case None =>
          done.add(p)
          p.children.foreach(visit)
          p.expressions.foreach(_.foreach {
            case s: SubqueryExpression => visit(s.plan)
            case _ =>
          })
      }
    }
    visit(plan)
    out
  }
}

/** Matching and application, shared by the rule and by `explain` (one decision). */
object Matching {
  /** The Delta scans of a plan, subqueries and CTE definitions included. */
  def deltaScans(plan: LogicalPlan): Seq[DeltaScan] = {
    val out = mutable.ArrayBuffer[DeltaScan]()
    def walk(p: LogicalPlan): Unit = {
      p match {
        case DeltaScan(s) => out += s
        case _ =>
      }
      p.children.foreach(walk)
      p.expressions.foreach(_.foreach {
        case s: SubqueryExpression => walk(s.plan)
        case _ =>
      })
    }
    walk(plan)
    out.toSeq
  }

  def alreadyApplied(plan: LogicalPlan): Boolean = {
    var found = false
    def walk(p: LogicalPlan): Unit = if (!found) {
      p.expressions.foreach(_.foreach {
        case _: SketchTag => found = true
        case s: SubqueryExpression => walk(s.plan)
        case _ =>
      })
      p.children.foreach(walk)
    }
    walk(plan)
    found
  }

  /** The CTE definitions of a plan (subqueries included), by id. */
  def cteDefs(plan: LogicalPlan): Map[Long, LogicalPlan] = {
    val defs = mutable.Map[Long, LogicalPlan]()
    def walk(p: LogicalPlan): Unit = {
      p match {
        case w: WithCTE => w.cteDefs.foreach(d => defs(d.id) = d.child)
        case _ =>
      }
      p.children.foreach(walk)
      p.expressions.foreach(_.foreach {
        case s: SubqueryExpression => walk(s.plan)
        case _ =>
      })
    }
    walk(plan)
    defs.toMap
  }

  /** Reads of each table id in the whole plan, a CTE's reads counted once per reference. */
  def scanCounts(plan: LogicalPlan): Map[String, Int] = {
    val defs = cteDefs(plan)
    val counts = mutable.Map[String, Int]().withDefaultValue(0)
    def walk(p: LogicalPlan, depth: Int): Unit = {
      p match {
        case DeltaScan(s) => counts(s.tableId) += 1
        case r: CTERelationRef if depth < 16 => defs.get(r.cteId).foreach(walk(_, depth + 1))
        case w: WithCTE => walk(w.plan, depth); return
        case _ =>
      }
      p.children.foreach(walk(_, depth))
      p.expressions.foreach(_.foreach {
        case s: SubqueryExpression => walk(s.plan, depth)
        case _ =>
      })
    }
    walk(plan, 0)
    counts.toMap
  }

  /** Scans inside a subtree (CTE references followed), counted per table id. */
  def subtreeScans(p: LogicalPlan, defs: Map[Long, LogicalPlan]): Seq[DeltaScan] = {
    val out = mutable.ArrayBuffer[DeltaScan]()
    def walk(x: LogicalPlan, depth: Int): Unit = {
      x match {
        case DeltaScan(s) => out += s
        case r: CTERelationRef if depth < 16 => defs.get(r.cteId).foreach(walk(_, depth + 1))
        case _ =>
      }
      x.children.foreach(walk(_, depth))
      x.expressions.foreach(_.foreach {
        case s: SubqueryExpression => walk(s.plan, depth)
        case _ =>
      })
    }
    walk(p, 0)
    out.toSeq
  }

  /** Where manifests for these tables live: the configured locations, else `_imp_sketches` beside each table. */
  def locations(session: SparkSession, tablePaths: Seq[String]): Seq[String] = {
    val configured = session.conf.getOption(RuleConf.Location).toSeq.flatMap(_.split(",")).map(_.trim)
      .filter(_.nonEmpty)
    if (configured.nonEmpty) configured
    else tablePaths.flatMap(p => Option(new Path(p).getParent)).map(d => new Path(d, RuleConf.DefaultDir).toString)
      .distinct
  }

  /** The manifests of the locations for these tables. When the session expects sketch versions
   * (`spark.imp.sketches.expect`) that no location's cached state holds yet, the locations are read again first. */
  def manifests(session: SparkSession, tablePaths: Seq[String]): Seq[(Manifest, String)] = {
    val refresh = session.conf.get(RuleConf.Refresh, "5").toLong
    val locs = locations(session, tablePaths)
    def conf = session.sessionState.newHadoopConf()
    var states = locs.map(loc => loc -> ManifestStore.get(loc, conf, refresh))
    val expected = RuleConf.expected(session)
    def held(id: Long, v: Long) = states.exists(_._2.manifests.exists(m => m.sketchId == id && m.version >= v))
    if (expected.exists { case (id, v) => !held(id, v) }) states = locs.map(loc => loc -> ManifestStore.refresh(loc, conf))
    states.flatMap { case (loc, state) => state.manifests.map(_ -> loc) }
  }

  /** Every check, in order; the first that fails is the verdict. */
  def check(session: SparkSession, m: Manifest, location: String, p: LogicalPlan, e: Enc,
      counts: Map[String, Int], defs: Map[Long, LogicalPlan]): Verdict = {
    if (!m.usable) return Refused(s"unusable: ${m.reason.getOrElse("no reason recorded")}")
    if (m.signature.isEmpty) return Refused("the manifest holds no plan signature (`imp sketch publish` records one)")
    if (!m.signature.contains(e.hash)) return Refused("the plan signature differs")
    e.unmatchable.foreach(why => return Refused(s"the plan has $why"))
    for ((key, value) <- m.semantics) {
      val now = session.conf.getOption(key).getOrElse("")
      if (!now.equalsIgnoreCase(value)) return Refused(s"$key is $now here, the sketch was computed with $value")
    }
    val inside = subtreeScans(p, defs)
    for (t <- m.tables) {
      val reads = inside.filter(_.tableId == t.id)
      if (reads.isEmpty) return Refused(s"table ${t.name} (id ${t.id}) is not read by the query")
      reads.find(_.version != t.version).foreach(s =>
        return Refused(s"table ${t.name} at version ${s.version}, sketch at ${t.version}"))
      if (counts.getOrElse(t.id, 0) > reads.size)
        return Refused(s"table ${t.name} is also read outside the sketched part of the query")
    }
    val lits = e.literals
    if (lits.size != m.slots.size) return Refused(s"the query has ${lits.size} constants, the sketch ${m.slots.size}")
    for (c <- m.slots) {
      val l = lits(c.slot)
      if (l.dataType.catalogString != c.dataType)
        return Refused(s"slot ${c.slot} is of type ${l.dataType.catalogString}, the sketch's of ${c.dataType}")
      if (!Slots.holds(c, l))
        return Refused(s"slot ${c.slot} value ${Encoder.literalText(l).getOrElse("NULL")} is outside its " +
          s"constraint (${c.op} ${c.value.getOrElse("NULL")})")
    }
    for (part <- m.partitions) {
      inside.filter(_.tableId == part.tableId).foreach { s =>
        val col = s.relation.output.find(_.name == part.column)
        if (col.isEmpty) return Refused(s"table ${part.table} has no column ${part.column}")
        if (col.get.dataType.catalogString != part.dataType)
          return Refused(s"${part.table}.${part.column} is ${col.get.dataType.catalogString}, the sketch's " +
            s"${part.dataType}")
      }
    }
    Applies(m, location, inside.filter(s => m.tables.exists(_.id == s.tableId)))
  }

  /** `plan` with the sketch applied inside `target`: each scan of a table the sketch depends on pinned to the
   * manifest's version (a latest read would otherwise re-read the log when it is planned), the partitioned ones
   * filtered by the kept ranges and tagged. */
  def applyTo(plan: LogicalPlan, target: LogicalPlan, a: Applies): LogicalPlan = {
    val identity = java.util.Collections.newSetFromMap(new java.util.IdentityHashMap[AnyRef, java.lang.Boolean]())
    a.scans.foreach(s => identity.add(s.relation))
    val parts = a.manifest.partitions.map(p => p.tableId -> p).toMap
    val versions = a.manifest.tables.map(t => t.id -> t.version).toMap
    def restrict(p: LogicalPlan): LogicalPlan = p.transformUpWithSubqueries {
      case DeltaScan(s) if identity.contains(s.relation) =>
        val pinned = pin(s, versions(s.tableId))
        parts.get(s.tableId) match {
          case Some(part) =>
            val col = pinned.output.find(_.name == part.column).get
            Filter(And(Ranges.predicate(col, part), SketchTag(a.manifest.sketch, a.manifest.version)), pinned)
          case None => pinned
        }
    }
    // CTE definitions read inside the target are rewritten where they are defined (every reference is inside it)
    val cteIds = mutable.Set[Long]()
    target.foreach {
      case r: CTERelationRef => cteIds += r.cteId
      case _ =>
    }
    plan.transformDownWithSubqueries {
      case p if p eq target => restrict(p)
      case d: CTERelationDef if cteIds(d.id) && subtreeScans(d.child, Map.empty).exists(s => identity.contains(s.relation)) =>
        d.copy(child = restrict(d.child))
    }
  }

  /** The scan reading exactly `version`, as a time-travel read of the snapshot it was analyzed at. */
  private def pin(s: DeltaScan, version: Long): LogicalPlan = {
    if (s.index.isTimeTravelQuery) return s.relation
    val snapshot = s.index.deltaLog.getSnapshotAt(version)
    val index = TahoeLogFileIndex(s.index.spark, s.index.deltaLog, s.index.path, snapshot, s.index.catalogTableOpt,
      s.index.partitionFilters, true)
    s.relation.relation match {
      case h: HadoopFsRelation => s.relation.copy(relation = h.copy(location = index)(h.sparkSession))
    }
  }

  def describe(a: Applies): String = {
    val parts = a.manifest.partitions.map { p =>
      val files = (p.filesKept, p.filesTotal) match {
        case (Some(k), Some(t)) => s", $k of $t files"
        case _ => ""
      }
      s"${p.table}.${p.column}: ${p.fragmentsKept} of ${p.fragmentsTotal} fragments$files"
    }.mkString("; ")
    s"imp: applied sketch ${a.manifest.sketch} v${a.manifest.version} ($parts)"
  }
}

/** Slot constraints: `=` the captured value, or a tightening (`>=`, `<=`) of a numeric or date/time value. */
object Slots {
  def holds(c: SlotConstraint, l: Literal): Boolean = {
    val now = Encoder.literalText(l)
    c.op match {
      case "=" => now == c.value
      case ">=" | "<=" =>
        (now, c.value) match {
          case (Some(x), Some(y)) if ordered(l.dataType) =>
            val cmp = BigDecimal(x).compare(BigDecimal(y))
            if (c.op == ">=") cmp >= 0 else cmp <= 0
          case _ => false
        }
      case _ => false
    }
  }

  private def ordered(d: DataType): Boolean = d match {
    case ByteType | ShortType | IntegerType | LongType | DateType | TimestampType | TimestampNTZType => true
    case _: DecimalType => true
    case _ => false
  }
}

/** The kept ranges as a predicate on the partition column, with literals of the column's own type. */
object Ranges {
  def predicate(col: Attribute, part: ManifestPartition): Expression = {
    val terms = part.ranges.map { r =>
      val conds = r.lo.map(v => GreaterThanOrEqual(col, value(v, col.dataType))).toSeq ++
        r.hi.map(v => LessThan(col, value(v, col.dataType))).toSeq
      val range: Expression = conds.reduceOption(And).getOrElse(Literal(true))
      if (r.nulls) Or(range, IsNull(col)) else range
    }
    terms.reduceOption(Or).getOrElse(Literal(false))
  }

  /** A bound's text as a literal of `dt` (timestamps are written in UTC with their zone). */
  def value(text: String, dt: DataType): Literal = {
    val cast = Cast(Literal(text), dt, Some("UTC"), EvalMode.LEGACY)
    val v = cast.eval(InternalRow.empty)
    if (v == null) throw new IllegalArgumentException(s"bound '$text' is not a ${dt.catalogString}")
    Literal(v, dt)
  }
}
