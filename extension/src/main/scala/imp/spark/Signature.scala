package imp.spark

import java.nio.charset.StandardCharsets
import java.security.MessageDigest
import java.util.IdentityHashMap

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions._
import org.apache.spark.sql.catalyst.plans.logical._
import org.apache.spark.sql.delta.files.TahoeLogFileIndex
import org.apache.spark.sql.execution.datasources.{HadoopFsRelation, LogicalRelation}
import org.apache.spark.sql.types.DataType

/**
 * The canonical signature of one (sub)plan: computed bottom-up, each node's hash from its own canonical text and
 * its children's hashes, so every subtree of a plan is encoded in one linear pass.
 *
 * What is abstracted: attributes become their position in the children's outputs (a Delta scan's columns their
 * name and type), so expression ids and alias names never matter; a Delta scan becomes its table id (the version
 * is checked apart, against the manifest); literals become typed slots, numbered in the order of this traversal
 * (children first, then the node's own expressions left to right). What is kept: every operator and expression by
 * kind with all its other fields (join type, time zone, evaluation mode, ...); the ids of common subexpressions
 * (`With`, which BETWEEN and others are analyzed into) become their order of first use in the node. Nodes that only rename (a
 * SubqueryAlias, a View, a projection of its child's columns in order) and CTE references (encoded as their
 * definition) are transparent. Anything the encoder cannot prove equal by its fields (a UDF, a lambda, an unknown
 * object, a non-Delta scan, a nondeterministic or time-dependent expression) makes the subtree unmatchable.
 *
 * @param hash      hex digest of the subtree
 * @param local     this node's canonical text (children by hash)
 * @param children  the children's encodings (for explaining where two plans differ)
 * @param outDesc   how a parent names each output column of this node
 * @param literals  the subtree's literal slots in order
 * @param unmatchable why the subtree can never match (None: it can)
 */
final case class Enc(
    hash: String,
    local: String,
    children: Seq[Enc],
    outDesc: IndexedSeq[String],
    literals: Vector[Literal],
    unmatchable: Option[String])

/** A Delta scan of the plan: its relation node, file index, table id and the version it reads. */
final case class DeltaScan(relation: LogicalRelation, index: TahoeLogFileIndex) {
  def tableId: String = index.snapshotAtAnalysis.metadata.id
  def version: Long = index.snapshotAtAnalysis.version
  def path: String = index.path.toString
}

object DeltaScan {
  def unapply(p: LogicalPlan): Option[DeltaScan] = p match {
    case l: LogicalRelation if !l.isStreaming => l.relation match {
      case h: HadoopFsRelation => h.location match {
        case t: TahoeLogFileIndex if t.partitionFilters.isEmpty => Some(DeltaScan(l, t))
        case _ => None
      }
      case _ => None
    }
    case _ => None
  }
}

/** Encodes plans; one instance per plan (it remembers each node's encoding and the CTE definitions seen). */
final class Encoder {
  private val memo = new IdentityHashMap[LogicalPlan, Enc]()
  private val ctes = mutable.Map[Long, Enc]()
  /** Every encoded node (including subquery plans) in pre-order of the traversal, with its encoding. */
  val nodes: mutable.ArrayBuffer[(LogicalPlan, Enc)] = mutable.ArrayBuffer()

  /** Attribute naming context: the outputs of a node's children, how those children name them, enclosing scopes. */
  private final case class Ctx(
      childOutputs: Seq[Seq[Attribute]],
      childDescs: Seq[IndexedSeq[String]],
      own: Seq[Attribute],
      scopes: List[(Seq[Seq[Attribute]], Seq[IndexedSeq[String]])],
      common: mutable.Map[Long, Int] = mutable.Map())

  def encode(plan: LogicalPlan): Enc = node(plan, Nil)

  /** The encoding of a node already encoded (by identity), if any. */
  def encodingOf(p: LogicalPlan): Option[Enc] = Option(memo.get(p))

  private def node(p: LogicalPlan, scopes: List[(Seq[Seq[Attribute]], Seq[IndexedSeq[String]])]): Enc = {
    val known = memo.get(p)
    if (known != null) return known
    val e = p match {
      case s: SubqueryAlias => node(s.child, scopes)
      case v: View => node(v.child, scopes)
      case w: WithCTE =>
        w.cteDefs.foreach(d => ctes(d.id) = node(d.child, scopes))
        node(w.plan, scopes)
      case r: CTERelationRef => ctes.get(r.cteId) match {
        case Some(d) if d.outDesc.size == r.output.size => d
        case _ => leaf("cte?", r.output.map(_ => "?").toIndexedSeq, Some("a CTE reference whose definition is unknown"))
      }
      case pr: Project if isIdentity(pr) => node(pr.child, scopes)
      case DeltaScan(s) =>
        leaf(s"delta(${s.tableId})", s.relation.output.map(a => s"${a.name}:${typeText(a.dataType)}").toIndexedSeq,
          None)
      case _: LeafNode => leaf(p.nodeName, p.output.indices.map(_.toString), Some(s"a ${p.nodeName} scan"))
      case _ => generic(p, scopes)
    }
    memo.put(p, e)
    nodes += ((p, e))
    e
  }

  /** A projection of its child's columns in their order, each at most renamed (a view's column list, `SELECT *`). */
  private def isIdentity(p: Project): Boolean =
    p.projectList.size == p.child.output.size && p.projectList.zip(p.child.output).forall {
      case (a: Attribute, b) => a.exprId == b.exprId
      case (Alias(a: Attribute, _), b) => a.exprId == b.exprId
      case (Alias(c: Cast, _), b) => c.dataType == b.dataType && (c.child match {
        case a: Attribute => a.exprId == b.exprId
        case _ => false
      })
      case _ => false
    }

  private def leaf(local: String, outDesc: IndexedSeq[String], unmatchable: Option[String]): Enc =
    Enc(Encoder.digest(local), local, Nil, outDesc, Vector.empty, unmatchable)

  private def generic(p: LogicalPlan, scopes: List[(Seq[Seq[Attribute]], Seq[IndexedSeq[String]])]): Enc = {
    val kids = p.children.map(c => node(c, scopes))
    val ctx = Ctx(p.children.map(_.output), kids.map(_.outDesc), p.output, scopes)
    val lits = mutable.ArrayBuffer[Literal]()
    val why = mutable.ArrayBuffer[String]()
    val childSet = java.util.Collections.newSetFromMap(new IdentityHashMap[AnyRef, java.lang.Boolean]())
    p.children.foreach(childSet.add)
    val fields = p.productIterator.zip(p.productElementNames).flatMap { case (v, name) =>
      v match {
        case c: LogicalPlan if childSet.contains(c) => None
        case cs: Seq[_] if cs.nonEmpty && cs.forall(x => x.isInstanceOf[LogicalPlan] && childSet.contains(x)) => None
        case _ => Some(s"$name=${field(v, ctx, lits, why)}")
      }
    }.mkString(",")
    val local = s"${p.nodeName}($fields)"
    val hash = Encoder.digest(local + "|" + kids.map(_.hash).mkString(","))
    val unmatchable = kids.flatMap(_.unmatchable).headOption.orElse(why.headOption)
    Enc(hash, local, kids, p.output.indices.map(_.toString), kids.flatMap(_.literals).toVector ++ lits, unmatchable)
  }

  private def field(v: Any, ctx: Ctx, lits: mutable.ArrayBuffer[Literal], why: mutable.ArrayBuffer[String]): String =
    v match {
      case null => "null"
      case e: Expression => expr(e, ctx, lits, why)
      case _: LogicalPlan => why += "a plan inside an operator's fields"; "plan?"
      case o: Option[_] => o.map(x => s"Some(${field(x, ctx, lits, why)})").getOrElse("None")
      case s: scala.collection.Map[_, _] =>
        s.toSeq.map { case (k, x) => s"${field(k, ctx, lits, why)}->${field(x, ctx, lits, why)}" }.sorted
          .mkString("{", ",", "}")
      case s: Iterable[_] => s.map(x => field(x, ctx, lits, why)).mkString("[", ",", "]")
      case s: String => "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\""
      case b: Boolean => b.toString
      case n: java.lang.Number => n.toString
      case c: Char => s"'$c'"
      case d: DataType => typeText(d)
      // drawn from a global counter when the expression is built (BETWEEN's With): numbered by first use instead
      case c: CommonExpressionId => s"cse${ctx.common.getOrElseUpdate(c.id, ctx.common.size)}"
      case v: scala.Enumeration#Value => v.toString
      case p: Product => p.productPrefix + p.productIterator.map(x => field(x, ctx, lits, why)).mkString("(", ",", ")")
      case other => why += s"a field of type ${other.getClass.getSimpleName}"; "?"
    }

  private val skippedExprFields = Set("exprId", "resultId", "qualifier", "explicitMetadata",
    "nonInheritableMetadataKeys", "metadata")

  private def expr(e: Expression, ctx: Ctx, lits: mutable.ArrayBuffer[Literal],
      why: mutable.ArrayBuffer[String]): String = e match {
    case l: Literal =>
      lits += l
      s"?${typeText(l.dataType)}"
    case a: AttributeReference => attribute(a, ctx, why)
    case o: OuterReference => outer(o.e.toAttribute, ctx, why)
    case al: Alias => s"alias(${expr(al.child, ctx, lits, why)})"
    case s: SubqueryExpression =>
      val inner = node(s.plan, (ctx.childOutputs, ctx.childDescs) :: ctx.scopes)
      inner.unmatchable.foreach(why += _)
      lits ++= inner.literals
      val fields = s.productIterator.zip(s.productElementNames).collect {
        case (v, name) if name != "plan" && !skippedExprFields(name) => s"$name=${field(v, ctx, lits, why)}"
      }.mkString(",")
      s"${s.nodeName}(plan#${inner.hash},$fields)"
    case _ if !e.deterministic => why += s"the nondeterministic ${e.prettyName}"; "?"
    case _ if Encoder.timeDependent(e) => why += s"the time-dependent ${e.prettyName}"; "?"
    case _ =>
      val fields = e.productIterator.zip(e.productElementNames).collect {
        case (v, name) if !skippedExprFields(name) => field(v, ctx, lits, why)
      }.mkString(",")
      s"${e.nodeName}($fields)"
  }

  private def attribute(a: Attribute, ctx: Ctx, why: mutable.ArrayBuffer[String]): String = {
    ctx.childOutputs.iterator.zipWithIndex.foreach { case (out, k) =>
      val i = out.indexWhere(_.exprId == a.exprId)
      if (i >= 0) return s"$k.${ctx.childDescs(k)(i)}"
    }
    val i = ctx.own.indexWhere(_.exprId == a.exprId)
    if (i >= 0) return s"self.$i:${typeText(a.dataType)}"
    why += s"a column ${a.name} of no input"
    "?"
  }

  private def outer(a: Attribute, ctx: Ctx, why: mutable.ArrayBuffer[String]): String = {
    ctx.scopes.iterator.zipWithIndex.foreach { case ((outs, descs), depth) =>
      outs.iterator.zipWithIndex.foreach { case (out, k) =>
        val i = out.indexWhere(_.exprId == a.exprId)
        if (i >= 0) return s"outer$depth.$k.${descs(k)(i)}"
      }
    }
    why += s"an outer column ${a.name} of no enclosing query"
    "?"
  }

  private def typeText(d: DataType): String = d.catalogString
}

object Encoder {
  private val timeNames = Set("CurrentDate", "CurrentTimestamp", "Now", "LocalTimestamp", "CurrentTimeZone",
    "CurrentUser", "CurrentDatabase", "CurrentCatalog", "CurrentTime", "CurrentBatchTimestamp")

  /** Whether `e` reads the clock or the session (CURRENT_DATE, NOW(), CURRENT_USER, ...): a window frame's
   *  CURRENT ROW is a frame boundary, not a reading of the present. */
  def timeDependent(e: Expression): Boolean = e match {
    case _: SpecialFrameBoundary => false
    case _ =>
      val n = e.getClass.getSimpleName
      timeNames(n) || n.startsWith("Current")
  }

  def digest(text: String): String = {
    val md = MessageDigest.getInstance("SHA-256")
    md.digest(text.getBytes(StandardCharsets.UTF_8)).take(16).map(b => f"${b & 0xff}%02x").mkString
  }

  /** A literal's value as canonical text (None for NULL): what manifests store and slot constraints compare. */
  def literalText(l: Literal): Option[String] = Option(l.value).map {
    case d: org.apache.spark.sql.types.Decimal => d.toJavaBigDecimal.toPlainString
    case b: Array[Byte] => java.util.Base64.getEncoder.encodeToString(b)
    case other => other.toString
  }
}
