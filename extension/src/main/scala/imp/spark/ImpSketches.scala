package imp.spark

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.ObjectMapper
import com.fasterxml.jackson.databind.node.ObjectNode
import org.apache.spark.sql.{Dataset, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.expressions.SubqueryExpression
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.classic.SparkSession

/** `spark.sql.extensions=imp.spark.ImpSketchExtension`: the sketch rule in every session of the application. */
class ImpSketchExtension extends (SparkSessionExtensions => Unit) {
  override def apply(ext: SparkSessionExtensions): Unit =
    ext.injectPostHocResolutionRule(s => new SketchRule(s.asInstanceOf[SparkSession]))
}

/**
 * What imp's Python side calls through the JVM gateway: the signature of a registered query (computed by the same
 * encoder the rule uses), a forced refresh of the cached manifests, the explanation of a query, and the sketch
 * versions applied to a DataFrame. Every result is JSON text.
 */
object ImpSketches {
  private val mapper = new ObjectMapper()

  /** The signature of `sql`'s analyzed plan, each `tables` name read as the Delta table at its path, in a fresh
   * session with `conf` set and the rule off. */
  def signature(spark: SparkSession, sql: String, tables: java.util.Map[String, String],
      conf: java.util.Map[String, String]): String = {
    val s = spark.newSession()
    conf.asScala.foreach { case (k, v) => s.conf.set(k, v) }
    s.conf.set(RuleConf.Enabled, "false")
    tables.asScala.foreach { case (name, path) => s.read.format("delta").load(path).createOrReplaceTempView(name) }
    val plan = s.sql(sql).queryExecution.analyzed
    val enc = new Encoder().encode(plan)
    val out = mapper.createObjectNode()
    out.put("hash", enc.hash)
    enc.unmatchable.foreach(out.put("unmatchable", _))
    out.set[ObjectNode]("tree", tree(enc))
    val slots = out.putArray("slots")
    enc.literals.zipWithIndex.foreach { case (l, i) =>
      val o = slots.addObject()
      o.put("slot", i)
      o.put("type", l.dataType.catalogString)
      Encoder.literalText(l) match {
        case Some(v) => o.put("value", v)
        case None => o.putNull("value")
      }
      l.origin.startIndex.foreach(x => o.put("start", x))
      l.origin.stopIndex.foreach(x => o.put("stop", x))
    }
    mapper.writeValueAsString(out)
  }

  private def tree(e: Enc): ObjectNode = {
    val o = mapper.createObjectNode()
    o.put("h", e.hash)
    o.put("n", e.local)
    val c = o.putArray("c")
    e.children.foreach(x => c.add(tree(x)))
    o
  }

  /** Re-read every manifest location this driver knows (and `location`, when given) now. */
  def refresh(spark: SparkSession, location: String): Unit = {
    ManifestStore.refreshAll()
    if (location != null && location.nonEmpty) ManifestStore.refresh(location, spark.sessionState.newHadoopConf())
  }

  /** The sketch versions applied to a DataFrame's plan: `[{"sketch": name, "version": n}]`. */
  def applied(df: Dataset[_]): String = {
    val out = mapper.createArrayNode()
    val seen = scala.collection.mutable.LinkedHashSet[(String, Long)]()
    def walk(p: LogicalPlan): Unit = {
      p.expressions.foreach(_.foreach {
        case t: SketchTag => seen += ((t.sketch, t.version))
        case s: SubqueryExpression => walk(s.plan)
        case _ =>
      })
      p.children.foreach(walk)
    }
    walk(df.queryExecution.analyzed)
    seen.foreach { case (n, v) => out.addObject().put("sketch", n).put("version", v) }
    mapper.writeValueAsString(out)
  }

  /** For each published sketch of the query's tables: whether it applies, or the first check that fails. */
  def explain(spark: SparkSession, sql: String): String = {
    val before = spark.conf.getOption(RuleConf.Enabled)
    spark.conf.set(RuleConf.Enabled, "false")
    val plan = try spark.sql(sql).queryExecution.analyzed finally {
      before match {
        case Some(v) => spark.conf.set(RuleConf.Enabled, v)
        case None => spark.conf.unset(RuleConf.Enabled)
      }
    }
    val out = mapper.createObjectNode()
    val results = out.putArray("sketches")
    val problems = out.putArray("locations")
    val scans = Matching.deltaScans(plan)
    val paths = scans.map(_.path)
    val refresh = spark.conf.get(RuleConf.Refresh, "5").toLong
    val ids = scans.map(_.tableId).toSet
    val enc = new Encoder
    enc.encode(plan)
    val counts = Matching.scanCounts(plan)
    val defs = Matching.cteDefs(plan)
    for (loc <- Matching.locations(spark, paths)) {
      val state = ManifestStore.get(loc, spark.sessionState.newHadoopConf(), refresh)
      state.error.foreach(e => problems.addObject().put("location", loc).put("reason", e))
      state.damaged.foreach { case (f, why) => problems.addObject().put("location", loc).put("file", f)
        .put("reason", s"damaged manifest ignored: $why") }
      for (m <- state.manifests if m.tables.exists(t => ids(t.id))) {
        val verdict = decide(spark, m, loc, enc, counts, defs)
        val o = results.addObject()
        o.put("sketch", m.sketch).put("version", m.version).put("location", loc)
        verdict match {
          case a: Applies => o.put("applies", true).put("detail", Matching.describe(a).stripPrefix("imp: "))
          case Refused(why) => o.put("applies", false).put("reason", why)
        }
      }
    }
    mapper.writeValueAsString(out)
  }

  private def decide(spark: SparkSession, m: Manifest, loc: String, enc: Encoder, counts: Map[String, Int],
      defs: Map[Long, LogicalPlan]): Verdict = {
    if (!m.usable) return Refused(s"unusable: ${m.reason.getOrElse("no reason recorded")}")
    val matching = enc.nodes.filter(x => m.signature.contains(x._2.hash))
    if (matching.isEmpty) return Refused(difference(m, enc))
    val verdicts = matching.map { case (p, e) => Matching.check(spark, m, loc, p, e, counts, defs) }
    verdicts.collectFirst { case a: Applies => a }.getOrElse(verdicts.head)
  }

  /** Where the closest subtree of the query departs from the sketch's plan. */
  private def difference(m: Manifest, enc: Encoder): String = {
    val root = m.tree.getOrElse(return "the plan signature differs (the manifest has no plan tree)")
    def kind(text: String): String = text.takeWhile(_ != '(')
    def diff(t: com.fasterxml.jackson.databind.JsonNode, e: Enc, depth: Int): (Int, String) = {
      if (t.path("h").asText() == e.hash) return (Int.MaxValue, "")
      val children = t.path("c").elements().asScala.toSeq
      if (t.path("n").asText() != e.local || children.size != e.children.size)
        return (depth, s"signature differs at ${kind(t.path("n").asText())} (depth $depth): the query has " +
          s"${e.local.take(300)}, the sketch ${t.path("n").asText().take(300)}")
      children.zip(e.children).find { case (a, b) => a.path("h").asText() != b.hash } match {
        case Some((a, b)) => diff(a, b, depth + 1)
        case None => (depth, s"signature differs below ${kind(e.local)} (depth $depth)")
      }
    }
    val rootKind = kind(root.path("n").asText())
    val found = enc.nodes.filter(x => kind(x._2.local) == rootKind).map(x => diff(root, x._2, 0))
    if (found.isEmpty) s"signature differs: no part of the query is a $rootKind like the sketch's plan root"
    else found.maxBy(_._1)._2
  }

  /** Only for tests: forget every cached manifest. */
  def forget(): Unit = ManifestStore.forget()
}
