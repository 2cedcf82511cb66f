"""The JVM connectors every Spark session of imp loads: Delta Lake's Spark connector and Hadoop's S3A, pinned in
``conf/connector-pom.xml`` and fetched with Maven by ``./dev setup`` (into ``.jars/``, ``IMP_HOME/jars`` or
``IMP_SPARK_JARS``), with a manifest that makes the cache stale when the pom changes. See docs/DEPLOYMENT.md.

Command line::

    python -m imp_core.spark.connector fetch [DIR]     # mvn dependency:copy-dependencies into DIR (default: cache)
    python -m imp_core.spark.connector path            # print the cache folder
    python -m imp_core.spark.connector submit-args     # print spark-submit flags (one per line)
    python -m imp_core.spark.connector session-conf    # print the same as Spark properties (key=value)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from imp_core.config import ENV_PUBLISH_LOCATION, Settings
from imp_core.errors import ConfigError
from imp_core.sources import storage

POM = Path(__file__).parent / "conf" / "connector-pom.xml"
ENV_JARS = "IMP_SPARK_JARS"
MANIFEST = "imp-connectors.json"

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
SKETCH_LOCATION_CONF = "spark.imp.sketches.location"
SKETCH_ENABLED_CONF = "spark.imp.sketches.enabled"  # false: the extension leaves every plan of the session alone
SKETCH_EXPECT_CONF = "spark.imp.sketches.expect"  # "<sketch id>:<version>": re-read manifests that lack it

# The settings that shape a query's result, at the values sketches are computed under: a session evaluating SQL
# otherwise may need rows outside a sketch, so imp's extension applies sketches only in sessions with these values
# (the manifests record them), and the printed settings include them.
RESULT_SEMANTICS = {
    "spark.sql.ansi.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.caseSensitive": "true",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.legacy.timeParserPolicy": "CORRECTED",
}

_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


@dataclass(frozen=True)
class Artifact:
    group: str
    artifact: str
    version: str

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


def pinned() -> dict[str, Artifact]:
    """The directly pinned artifacts of the pom, by artifact id (versions with properties substituted)."""
    root = ET.parse(POM).getroot()
    props = {p.tag.split("}")[1]: (p.text or "").strip() for p in root.find("m:properties", _NS) or []}
    out = {}
    for dep in root.findall("m:dependencies/m:dependency", _NS):
        group = dep.findtext("m:groupId", namespaces=_NS) or ""
        artifact = dep.findtext("m:artifactId", namespaces=_NS) or ""
        version = dep.findtext("m:version", namespaces=_NS) or ""
        if version.startswith("${"):
            version = props[version[2:-1]]
        out[artifact] = Artifact(group, artifact, version)
    return out


def delta_version() -> str:
    return pinned()["delta-spark_4.2_2.13"].version


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def _checkout_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").exists() and (root / "imp_core").is_dir() else None


def jars_dir() -> Path:
    """Where the connector jars are (or will be) cached: ``IMP_SPARK_JARS``, the checkout's ``.jars``, or
    ``IMP_HOME/jars``."""
    configured = os.environ.get(ENV_JARS)
    if configured:
        return Path(configured).expanduser()
    root = _checkout_root()
    if root is not None:
        return root / ".jars"
    return Settings.from_env().home / "jars"


def jar_paths(directory: Path | None = None) -> list[Path]:
    """The cached jars, checked against the manifest of the current pom.

    Raises:
        ConfigError: The jars were never fetched, were fetched for another pom, or some are missing.
    """
    directory = directory or jars_dir()
    manifest = directory / MANIFEST
    fix = f"run ./dev setup (or python -m imp_core.spark.connector fetch {directory})"
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"the Delta Lake / S3A connector jars are not installed in {directory}; {fix}") from e
    if data.get("pom_sha256") != _pom_digest():
        raise ConfigError(f"the connector jars in {directory} were fetched for another connector-pom.xml; {fix}")
    paths = [directory / name for name in data.get("jars", [])]
    missing = [p.name for p in paths if not p.is_file()]
    if missing or not paths:
        raise ConfigError(f"connector jars missing in {directory} ({', '.join(missing[:3]) or 'none listed'}); {fix}")
    return paths


def fetch(directory: Path | None = None, quiet: bool = True) -> list[Path]:
    """Copy the pinned jars (and their runtime dependencies Spark lacks) into ``directory`` with Maven.

    A no-op when the manifest there already matches the pom. Maven keeps its own cache (``~/.m2``), so a second
    checkout fetches nothing over the network.

    Raises:
        ConfigError: Maven is not installed or the download failed.
    """
    directory = directory or jars_dir()
    try:
        return jar_paths(directory)
    except ConfigError:
        pass
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError("Maven (mvn) is needed to fetch the Delta Lake and S3A connector jars from Maven Central; "
                          f"install it (apt-get install maven) or set {ENV_JARS} to a folder holding them")
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".fetch-") as tmp:
        cmd = [mvn, "-B", *(["-q"] if quiet else []), "-f", str(POM), "dependency:copy-dependencies",
               f"-DoutputDirectory={tmp}"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise ConfigError(f"mvn could not fetch the connector jars (exit {done.returncode}):\n{tail}")
        names = sorted(p.name for p in Path(tmp).glob("*.jar"))
        for old in directory.glob("*.jar"):
            old.unlink()
        for name in names:
            os.replace(Path(tmp) / name, directory / name)
    (directory / MANIFEST).write_text(json.dumps({"pom_sha256": _pom_digest(), "jars": names}, indent=1) + "\n")
    return jar_paths(directory)


def session_conf(directory: Path | None = None) -> dict[str, str]:
    """Spark properties that load the connectors and imp's sketch extension into a session (``spark.jars``, Delta's
    extension and catalog, imp's extension after Delta's), with the result-shaping settings sketches are computed
    under, and the manifests' location when ``IMP_PUBLISH_LOCATION`` names one.

    Raises:
        ConfigError: The connector jars or the extension jar are not installed (run ./dev setup).
    """
    from imp_core.spark import extension  # a sibling module of this one, which the extension's build imports

    conf = {
        "spark.jars": ",".join(str(p) for p in [*jar_paths(directory), extension.require_built(directory)]),
        "spark.sql.extensions": f"{DELTA_EXTENSION},{extension.EXTENSION_CLASS}",
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        **RESULT_SEMANTICS,
    }
    location = os.environ.get(ENV_PUBLISH_LOCATION)
    if location:
        conf[SKETCH_LOCATION_CONF] = storage.spark_uri(location)
    return conf


def submit_args(directory: Path | None = None) -> list[str]:
    """``spark-submit`` flags with the same effect (the jars must be on the driver's classpath at launch)."""
    conf = session_conf(directory)
    args = ["--jars", conf.pop("spark.jars")]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def require_loaded(spark_conf_get: object) -> None:
    """Fail with a one-line error when a session someone else started lacks the Delta connector.

    Args:
        spark_conf_get: ``spark.conf.get`` of the session (taking a key and a default).
    """
    extensions = str(spark_conf_get("spark.sql.extensions", "") or "")  # type: ignore[operator]
    if DELTA_EXTENSION not in extensions:
        raise ConfigError("this Spark session does not load Delta Lake's connector; start it with "
                          "imp_core.spark.connector.session_conf() (spark-submit: add the flags printed by "
                          "`python -m imp_core.spark.connector submit-args`)")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "path"
    try:
        if command == "fetch":
            paths = fetch(Path(args[1]) if len(args) > 1 else None)
            print(f"{len(paths)} connector jars in {paths[0].parent} "
                  f"(delta-spark {delta_version()}, hadoop-aws {pinned()['hadoop-aws'].version})")
        elif command == "session-conf":
            print("\n".join(f"{k}={v}" for k, v in session_conf().items()))
        elif command == "path":
            print(jars_dir())
        elif command == "submit-args":
            print("\n".join(submit_args()))
        else:
            print("usage: python -m imp_core.spark.connector fetch [DIR] | path | submit-args | session-conf",
                  file=sys.stderr)
            return 2
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
