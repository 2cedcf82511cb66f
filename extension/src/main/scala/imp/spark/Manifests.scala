package imp.spark

import java.nio.charset.StandardCharsets
import java.security.MessageDigest
import java.util.concurrent.{ConcurrentHashMap, Executors, ThreadFactory, TimeUnit}

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.slf4j.LoggerFactory

/** One range of a partition to keep: `lo <= col < hi` (open where None), NULLs too when `nulls`. */
final case class KeptRange(lo: Option[String], hi: Option[String], nulls: Boolean)

/** A sketch's partition of one table: the column, its Spark type and the ranges its kept fragments merge into. */
final case class ManifestPartition(tableId: String, table: String, column: String, dataType: String,
    ranges: Seq[KeptRange], fragmentsKept: Int, fragmentsTotal: Int, filesKept: Option[Long],
    filesTotal: Option[Long])

/** A table the sketch version depends on: Delta identity (metadata id, path) and the version it reflects. */
final case class ManifestTable(name: String, id: String, path: String, version: Long)

/** The constraint on one literal slot: `=` the captured value, or `>=` / `<=` it (a tightening). */
final case class SlotConstraint(slot: Int, dataType: String, value: Option[String], op: String)

/** A published sketch version (the JSON written by imp_core.publish, checksum verified). */
final case class Manifest(file: String, sketchId: Long, sketch: String, version: Long, usable: Boolean,
    reason: Option[String], signature: Option[String], tree: Option[JsonNode], slots: Seq[SlotConstraint],
    semantics: Map[String, String], tables: Seq[ManifestTable], partitions: Seq[ManifestPartition]) {
  def label: String = s"imp sketch $sketch v$version"
}

/** What one location holds: the newest manifest of each sketch, and the files that could not be used. */
final case class LocationState(manifests: Seq[Manifest], damaged: Map[String, String], error: Option[String],
    loadedAtMs: Long)

/**
 * Manifests cached in the driver, per location. A location is read synchronously the first time a query needs it,
 * then refreshed in the background every `spark.imp.sketches.refreshSeconds` (one listing; files are immutable, so
 * only new ones are read), so planning does no I/O once warm. A file that does not parse or whose checksum is
 * wrong is left out with one warning; an unreadable location holds no manifest (and is retried on each refresh).
 */
object ManifestStore {
  private val log = LoggerFactory.getLogger("imp.spark.ManifestStore")
  private val mapper = new ObjectMapper()
  val Format = 1

  private final case class Entry(conf: Configuration, @volatile var state: LocationState)
  private val locations = new ConcurrentHashMap[String, Entry]()
  private val parsed = new ConcurrentHashMap[String, Either[String, Manifest]]()
  private val warned = ConcurrentHashMap.newKeySet[String]()
  @volatile private var refreshSeconds: Long = 5
  @volatile private var started = false

  def get(location: String, conf: => Configuration, refresh: Long): LocationState = {
    refreshSeconds = math.max(1, refresh)
    val entry = locations.computeIfAbsent(location, _ => {
      val c = conf
      Entry(c, load(location, c))
    })
    startRefresher()
    entry.state
  }

  /** Re-read every known location now (what `imp query` calls right after it publishes). */
  def refreshAll(): Unit = locations.asScala.foreach { case (loc, e) => e.state = load(loc, e.conf) }

  def refresh(location: String, conf: Configuration): LocationState = {
    val e = locations.computeIfAbsent(location, _ => Entry(conf, load(location, conf)))
    e.state = load(location, e.conf)
    e.state
  }

  def forget(): Unit = { locations.clear(); parsed.clear() }

  private def startRefresher(): Unit = if (!started) synchronized {
    if (!started) {
      val pool = Executors.newSingleThreadScheduledExecutor(new ThreadFactory {
        def newThread(r: Runnable): Thread = {
          val t = new Thread(r, "imp-sketch-manifests")
          t.setDaemon(true)
          t
        }
      })
      pool.scheduleWithFixedDelay(() => {
        try {
          val now = System.currentTimeMillis()
          locations.asScala.foreach { case (loc, e) =>
            if (now - e.state.loadedAtMs >= refreshSeconds * 1000) e.state = load(loc, e.conf)
          }
          Applications.flush()
        } catch { case NonFatal(t) => log.warn(s"imp: manifest refresh failed: ${t.getMessage}") }
      }, 1, 1, TimeUnit.SECONDS)
      started = true
    }
  }

  private val FileName = """s(\d+)-v(\d+)\.json""".r

  def load(location: String, conf: Configuration): LocationState = {
    val now = System.currentTimeMillis()
    try {
      val dir = new Path(location)
      val fs = dir.getFileSystem(conf)
      val listed = try fs.listStatus(dir).toSeq catch {
        case _: java.io.FileNotFoundException => Seq.empty
      }
      val named = listed.filter(_.isFile).flatMap(s => s.getPath.getName match {
        case FileName(id, v) => Some((id.toLong, v.toLong, s.getPath))
        case _ => None
      })
      val newest = named.groupBy(_._1).values.map(_.maxBy(_._2)).toSeq
      val results = newest.map { case (_, _, path) =>
        val key = path.toString
        key -> parsed.computeIfAbsent(key, _ => read(fs, path))
      }
      val damaged = results.collect { case (k, Left(why)) => k -> why }.toMap
      damaged.foreach { case (k, why) =>
        if (warned.add(k)) log.warn(s"imp: ignoring sketch manifest $k: $why")
      }
      LocationState(results.collect { case (_, Right(m)) => m }, damaged, None, now)
    } catch {
      case NonFatal(t) =>
        val why = s"cannot read sketch manifests at $location: ${t.getClass.getSimpleName}: ${t.getMessage}"
        if (warned.add(location)) log.warn(s"imp: $why")
        LocationState(Nil, Map.empty, Some(why), now)
    }
  }

  private def read(fs: FileSystem, path: Path): Either[String, Manifest] = try {
    val in = fs.open(path)
    val bytes = try in.readAllBytes() finally in.close()
    parse(path.toString, new String(bytes, StandardCharsets.UTF_8))
  } catch {
    case NonFatal(t) => Left(s"unreadable (${t.getClass.getSimpleName}: ${t.getMessage})")
  }

  def sha256(text: String): String =
    MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8))
      .map(b => f"${b & 0xff}%02x").mkString

  /** A manifest file's text: `{"format": 1, "sha256": hex, "body": "<JSON text>"}`, the digest over the body. */
  def parse(file: String, text: String): Either[String, Manifest] = try {
    val outer = mapper.readTree(text)
    if (outer == null || !outer.isObject) return Left("not a JSON object")
    if (outer.path("format").asInt(-1) != Format) return Left(s"format ${outer.path("format")} is not $Format")
    val body = outer.path("body").asText(null)
    if (body == null) return Left("no body")
    if (sha256(body) != outer.path("sha256").asText("")) return Left("checksum mismatch (damaged or edited)")
    val b = mapper.readTree(body)
    def opt(n: JsonNode): Option[String] = if (n == null || n.isMissingNode || n.isNull) None else Some(n.asText())
    val sig = b.path("signature")
    Right(Manifest(
      file = file,
      sketchId = b.path("sketch_id").asLong(),
      sketch = b.path("sketch").asText(),
      version = b.path("version").asLong(),
      usable = b.path("usable").asBoolean(false),
      reason = opt(b.get("unusable_reason")),
      signature = opt(sig.get("hash")),
      tree = Option(sig.get("tree")).filterNot(_.isNull),
      slots = sig.path("slots").elements().asScala.map(s =>
        SlotConstraint(s.path("slot").asInt(), s.path("type").asText(), opt(s.get("value")),
          s.path("op").asText("="))).toSeq,
      semantics = b.path("semantics").properties().asScala.map(e => e.getKey -> e.getValue.asText()).toMap,
      tables = b.path("tables").elements().asScala.map(t =>
        ManifestTable(t.path("name").asText(), t.path("id").asText(), t.path("path").asText(),
          t.path("version").asLong())).toSeq,
      partitions = b.path("partitions").elements().asScala.map(p =>
        ManifestPartition(p.path("table_id").asText(), p.path("table").asText(), p.path("column").asText(),
          p.path("type").asText(),
          p.path("ranges").elements().asScala.map(r =>
            KeptRange(opt(r.get("lo")), opt(r.get("hi")), r.path("nulls").asBoolean(false))).toSeq,
          p.path("fragments_kept").asInt(), p.path("fragments_total").asInt(),
          opt(p.get("files_kept")).map(_.toLong), opt(p.get("files_total")).map(_.toLong))).toSeq))
  } catch {
    case NonFatal(t) => Left(s"does not parse (${t.getClass.getSimpleName}: ${t.getMessage})")
  }
}

/**
 * How often each sketch was applied by this driver and when last: kept in memory, written by the refresher thread
 * (never by a query) as one small JSON file per driver under `<location>/_applications/`, replaced atomically, so
 * a page can sum the files without a Spark session.
 */
object Applications {
  private val log = LoggerFactory.getLogger("imp.spark.Applications")
  private final case class Count(var n: Long, var lastMs: Long, var version: Long)
  private val counts = new ConcurrentHashMap[(String, String), Count]()  // (location, sketch)
  private val confs = new ConcurrentHashMap[String, Configuration]()
  @volatile private var dirty = false
  val driverId: String = {
    val host = try java.net.InetAddress.getLocalHost.getHostName catch { case NonFatal(_) => "host" }
    s"$host-${ProcessHandle.current().pid()}-${System.currentTimeMillis()}".replaceAll("[^A-Za-z0-9_.-]", "_")
  }

  def record(location: String, conf: Configuration, sketch: String, version: Long): Unit = {
    confs.putIfAbsent(location, conf)
    val c = counts.computeIfAbsent((location, sketch), _ => Count(0, 0, 0))
    c.synchronized { c.n += 1; c.lastMs = System.currentTimeMillis(); c.version = version }
    dirty = true
  }

  def flush(): Unit = if (dirty) {
    dirty = false
    counts.asScala.groupBy(_._1._1).foreach { case (location, entries) =>
      try {
        val body = entries.map { case ((_, sketch), c) =>
          s""""${sketch.replace("\"", "")}":{"count":${c.n},"last_ms":${c.lastMs},"version":${c.version}}"""
        }.mkString(s"""{"driver":"$driverId","sketches":{""", ",", "}}")
        val dir = new Path(location, "_applications")
        val fs = dir.getFileSystem(confs.get(location))
        val target = new Path(dir, s"$driverId.json")
        val tmp = new Path(dir, s".$driverId.json.tmp")
        val out = fs.create(tmp, true)
        try out.write(body.getBytes(StandardCharsets.UTF_8)) finally out.close()
        if (!fs.rename(tmp, target)) { fs.delete(target, false); fs.rename(tmp, target) }
      } catch { case NonFatal(t) => log.debug(s"imp: cannot record applications at $location: ${t.getMessage}") }
    }
  }
}
