"""The JVM connectors' jars: Delta Lake's Spark connector and Hadoop's S3A, pinned in ``conf/connector-pom.xml`` and
fetched with Maven by ``./dev setup`` (into ``.jars/``, ``IMP_HOME/jars`` or ``IMP_SPARK_JARS``), with a manifest that
makes the cache stale when the pom changes. See docs/DEPLOYMENT.md.

Below both :mod:`imp_core.spark.extension` (compiled against these jars) and :mod:`imp_core.spark.connector` (a
session's settings, which load them and the extension); ``python -m imp_core.spark.connector fetch`` fetches them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from imp_core.config import Settings
from imp_core.errors import ConfigError

POM = Path(__file__).parent / "conf" / "connector-pom.xml"
ENV_JARS = "IMP_SPARK_JARS"
MANIFEST = "imp-connectors.json"

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
        raise ConfigError(
            "Maven (mvn) is needed to fetch the Delta Lake and S3A connector jars from Maven Central; "
            f"install it (apt-get install maven) or set {ENV_JARS} to a folder holding them"
        )
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".fetch-") as tmp:
        cmd = [
            mvn,
            "-B",
            *(["-q"] if quiet else []),
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp}",
        ]
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
