"""imp's Spark session extension (``extension/``, Scala 2.13): the optimizer rule that applies published sketches to
any query of a session that loads it (docs/DEPLOYMENT.md, "Queries from any client").

It is compiled against the very jars that run it: pyspark ships Spark's jars and the Scala compiler of its Scala
version (2.13.18 for pyspark 4.2.0), and Delta's connector is fetched by :mod:`imp_core.spark.connector`. So the build
needs neither Maven's Spark tree (~450 MB) nor a Scala installation, and cannot drift from the Spark it runs in.
The jar is named after the digest of its sources and of the jars it was compiled against, beside the connector jars
(``<jars>/imp-extension/``): a checkout whose sources changed builds its own jar, and an unchanged one reuses it.

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
from pathlib import Path

from imp_core.errors import ConfigError
from imp_core.spark import jars

EXTENSION_CLASS = "imp.spark.ImpSketchExtension"
API_CLASS = "imp.spark.ImpSketches"
SUBDIR = "imp-extension"


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
    spark_jars = sorted(pyspark_jars().glob("*.jar"))
    delta = [p for p in jars.jar_paths() if p.name.startswith(("delta-spark", "delta-storage"))]
    return spark_jars + delta


def digest() -> str:
    """Of the sources and the names of the jars compiled against (their versions are in the names)."""
    h = hashlib.sha256()
    root = _root()
    for path in sources():
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    for jar in _classpath():
        h.update(jar.name.encode() + b"\0")
    return h.hexdigest()[:16]


def jar_path(directory: Path | None = None) -> Path:
    """Where the jar of the current sources is (or will be built)."""
    base = directory or jars.jars_dir()
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


def _scalac(spark_jars: Path) -> list[str]:
    compiler = [spark_jars / f"{n}" for n in ("scala-compiler", "scala-library", "scala-reflect")]
    found = []
    for prefix in compiler:
        match = sorted(spark_jars.glob(f"{prefix.name}-2.13.*.jar"))
        if not match:
            raise ConfigError(f"pyspark's jars lack {prefix.name} (looked in {spark_jars}); reinstall pyspark")
        found.append(str(match[-1]))
    java = shutil.which("java")
    if java is None:
        raise ConfigError("Java 17 is needed to build imp's Spark extension; install a JDK 17")
    return [java, "-Xss8m", "-Xmx1g", "-cp", os.pathsep.join(found), "scala.tools.nsc.Main"]


def build(directory: Path | None = None, quiet: bool = True) -> Path:
    """Compile the sources into the jar (a no-op when the jar of these sources exists).

    Raises:
        ConfigError: Java, the jar tool or pyspark's compiler is missing, or the sources do not compile.
    """
    target = jar_path(directory)
    if target.is_file():
        return target
    jar_tool = shutil.which("jar")
    if jar_tool is None:
        raise ConfigError("the JDK's jar tool is needed to build imp's Spark extension; install a full JDK 17")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        args = Path(tmp) / "args"
        args.write_text("\n".join(["-classpath", os.pathsep.join(str(p) for p in _classpath()), "-d", str(classes),
                                   "-deprecation", "-release", "17", *(str(s) for s in sources())]) + "\n")
        done = subprocess.run([*_scalac(pyspark_jars()), f"@{args}"], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
            raise ConfigError(f"imp's Spark extension does not compile (exit {done.returncode}):\n{tail}")
        if not quiet and done.stdout.strip():
            print(done.stdout.strip())
        staged = Path(tmp) / target.name
        packed = subprocess.run([jar_tool, "cf", str(staged), "-C", str(classes), "."], capture_output=True,
                                text=True, check=False)
        if packed.returncode != 0:
            raise ConfigError(f"jar could not pack imp's Spark extension: {packed.stderr.strip()}")
        os.replace(staged, target)
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
