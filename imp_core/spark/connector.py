"""What every Spark session of imp loads: the pinned connector jars (:mod:`imp_core.spark.jars`: Delta Lake's Spark
connector and Hadoop's S3A) and imp's sketch extension (:mod:`imp_core.spark.extension`), with the settings that
shape a query's result. See docs/DEPLOYMENT.md.

Command line::

    python -m imp_core.spark.connector fetch [DIR]     # mvn dependency:copy-dependencies into DIR (default: cache)
    python -m imp_core.spark.connector path            # print the cache folder
    python -m imp_core.spark.connector submit-args     # print spark-submit flags (one per line)
    python -m imp_core.spark.connector session-conf    # print the same as Spark properties (key=value)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from imp_core.config import ENV_PUBLISH_LOCATION
from imp_core.errors import ConfigError
from imp_core.sources import storage
from imp_core.spark import extension
from imp_core.spark.jars import delta_version, fetch, jar_paths, jars_dir, pinned

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


def session_conf(directory: Path | None = None) -> dict[str, str]:
    """Spark properties that load the connectors and imp's sketch extension into a session (``spark.jars``, Delta's
    extension and catalog, imp's extension after Delta's), with the result-shaping settings sketches are computed
    under, and the manifests' location when ``IMP_PUBLISH_LOCATION`` names one.

    Raises:
        ConfigError: The connector jars or the extension jar are not installed (run ./dev setup).
    """
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
