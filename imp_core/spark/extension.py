"""imp's Spark session extension (``extension/``, Scala 2.13): the optimizer rule that applies published sketches to
any query of a session that loads it (docs/DEPLOYMENT.md, "Queries from any client").

Maven builds it (``extension/pom.xml``, Maven's Scala plugin) against the very jars that run it: Spark's own, from
pyspark's jars folder, and Delta's connector, fetched by :mod:`imp_core.spark.connector`, handed to the compiler as
a classpath. So Maven downloads only the Scala compiler and its plugin (cached in ``~/.m2``), never Spark's tree
(~450 MB), and the jar cannot drift from the Spark it runs in. The pom's Scala version must be pyspark's; the build
checks it. The jar is named after the digest of its sources, the pom and the jars it was compiled against, beside
the connector jars (``<jars>/imp-extension/``): a checkout whose sources changed builds its own jar, and an
unchanged one reuses it.

Command line::

    python -m imp_core.spark.extension build     # compile (a no-op when the jar of these sources exists)
    python -m imp_core.spark.extension path      # print the jar's path
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from imp_core.errors import ConfigError

EXTENSION_CLASS = "imp.spark.ImpSketchExtension"
API_CLASS = "imp.spark.ImpSketches"
SUBDIR = "imp-extension"
POM_NAME = "pom.xml"


def _root() -> Path:
    return Path(__file__).resolve().parents[2] / "extension"


def sources() -> list[Path]:
    """The extension's Scala sources, sorted."""
    return sorted((_root() / "src" / "main" / "scala").rglob("*.scala"))


def pyspark_jars() -> Path:
    import pyspark  # lazy: only the build needs it

    return Path(pyspark.__file__).parent / "jars"


def _classpath() -> list[Path]:
    """Spark's jars (pyspark's own) and Delta's connector: everything the sources compile against."""
    from imp_core.spark import connector

    spark_jars = sorted(pyspark_jars().glob("*.jar"))
    delta = [p for p in connector.jar_paths() if p.name.startswith(("delta-spark", "delta-storage"))]
    return spark_jars + delta


def digest() -> str:
    """Of the sources and the names of the jars compiled against (their versions are in the names)."""
    h = hashlib.sha256()
    root = _root()
    for path in [root / POM_NAME, *sources()]:
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    for jar in _classpath():
        h.update(jar.name.encode() + b"\0")
    return h.hexdigest()[:16]


def jar_path(directory: Path | None = None) -> Path:
    """Where the jar of the current sources is (or will be built)."""
    from imp_core.spark import connector

    base = directory or connector.jars_dir()
    return base / SUBDIR / f"imp-spark-extension-{digest()}.jar"


def require_built(directory: Path | None = None) -> Path:
    """The jar of the current sources.

    Raises:
        ConfigError: It was never built for these sources.
    """
    path = jar_path(directory)
    if not path.is_file():
        raise ConfigError(f"imp's Spark extension is not built for these sources ({path.name} missing); run "
                          f"./dev setup (or python -m imp_core.spark.extension build)")
    return path


def scala_version(pom: Path) -> str:
    """The pom's ``scala.version`` property."""
    found = ET.parse(pom).getroot().find("{http://maven.apache.org/POM/4.0.0}properties/"
                                         "{http://maven.apache.org/POM/4.0.0}scala.version")
    if found is None or not (found.text or "").strip():
        raise ConfigError(f"{pom} sets no scala.version property; restore it from git")
    return (found.text or "").strip()


def check_scala(pom: Path, spark_jars: Path) -> None:
    """The pom compiles with pyspark's Scala version (a jar built by another one fails at load time)."""
    version = scala_version(pom)
    if not (spark_jars / f"scala-library-{version}.jar").is_file():
        shipped = sorted(p.name for p in spark_jars.glob("scala-library-*.jar"))
        raise ConfigError(f"{pom} compiles with Scala {version} but pyspark ships {', '.join(shipped) or 'none'}; "
                          f"set scala.version in the pom to pyspark's")


def build(directory: Path | None = None, quiet: bool = True) -> Path:
    """Compile the sources into the jar with Maven (a no-op when the jar of these sources exists).

    Raises:
        ConfigError: Maven is missing, the pom's Scala is not pyspark's, or the sources do not compile.
    """
    target = jar_path(directory)
    if target.is_file():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError("Maven (mvn) is needed to build imp's Spark extension; install it (apt-get install maven)")
    pom = _root() / POM_NAME
    check_scala(pom, pyspark_jars())
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        cmd = [mvn, "-B", *(["-q"] if quiet else []), "-f", str(pom), "package",
               f"-Dimp.classpath={','.join(str(p) for p in _classpath())}", f"-Dimp.build={tmp}"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).strip().splitlines()
            tail = "\n".join([ln for ln in lines if "[ERROR]" in ln][:30] or lines[-30:])
            raise ConfigError(f"imp's Spark extension does not build (mvn exit {done.returncode}):\n{tail}")
        [built] = Path(tmp).glob("imp-spark-extension-*.jar")
        os.replace(built, target)
    return target


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "path"
    try:
        if command == "build":
            path = build(quiet=False)
            print(f"imp Spark extension: {path}")
        elif command == "path":
            print(jar_path())
        else:
            print("usage: python -m imp_core.spark.extension build | path", file=sys.stderr)
            return 2
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
