"""The connector jars: pinned in one pom, fetched by ./dev, loaded by every session the platform starts."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from imp_core.errors import ConfigError
from imp_core.spark import connector, extension


def test_the_pom_pins_delta_for_the_installed_spark_and_hadoop_at_pysparks_version() -> None:
    import pyspark

    pins = connector.pinned()
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    assert f"delta-spark_{spark_minor}_2.13" in pins, "delta-spark must be the build for the installed Spark"
    jars = Path(pyspark.__file__).parent / "jars"
    assert (jars / f"hadoop-client-api-{pins['hadoop-aws'].version}.jar").exists(), \
        "hadoop-aws must equal the Hadoop client pyspark ships"


def test_fetched_jars_match_the_pom_and_duplicate_nothing_spark_ships() -> None:
    import pyspark

    paths = connector.jar_paths()  # ./dev fetched them; a missing cache is an error, not a skip
    names = {p.name for p in paths}
    version = connector.delta_version()
    assert {f"delta-spark_4.2_2.13-{version}.jar", f"delta-storage-{version}.jar", "hadoop-aws-3.5.0.jar"} <= names
    assert not any(n.startswith("bundle-") for n in names), "the 690 MB AWS SDK bundle must not be fetched"
    shipped = {p.name.rsplit("-", 1)[0] for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    clashes = {n for n in names if n.rsplit("-", 1)[0] in shipped}
    assert not clashes, f"jars Spark already ships would be loaded twice: {clashes}"


def test_a_stale_or_missing_cache_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not installed in .*run ./dev setup"):
        connector.jar_paths(tmp_path)
    (tmp_path / connector.MANIFEST).write_text(json.dumps({"pom_sha256": "0" * 64, "jars": []}))
    with pytest.raises(ConfigError, match="fetched for another connector-pom.xml"):
        connector.jar_paths(tmp_path)


def test_submit_args_carry_jars_delta_settings_and_imps_extension() -> None:
    args = connector.submit_args()
    assert args[0] == "--jars" and "delta-spark" in args[1]
    assert str(extension.jar_path()) in args[1].split(",")
    assert f"spark.sql.extensions={connector.DELTA_EXTENSION},{extension.EXTENSION_CLASS}" in args  # Delta's first
    assert f"spark.sql.catalog.spark_catalog={connector.DELTA_CATALOG}" in args
    assert all(f"{k}={v}" in args for k, v in connector.RESULT_SEMANTICS.items())


def test_the_extension_jar_is_named_after_its_sources(tmp_path: Path) -> None:
    assert extension.jar_path().name == f"imp-spark-extension-{extension.digest()}.jar"
    assert extension.jar_path().is_file()  # ./dev setup built it
    with pytest.raises(ConfigError, match="not built for these sources.*./dev setup"):
        extension.require_built(tmp_path)


def test_a_session_without_the_connector_is_refused() -> None:
    with pytest.raises(ConfigError, match="does not load Delta Lake's connector"):
        connector.require_loaded(lambda key, default: default)


@pytest.mark.spark
def test_the_session_reads_and_writes_delta_through_the_connector(spark, tmp_path: Path) -> None:  # noqa: ANN001
    from deltalake import write_deltalake

    assert connector.DELTA_EXTENSION in spark.conf.get("spark.sql.extensions")
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"a": [1, 2, 3]}))
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (4)")  # a commit written by delta-spark
    assert sorted(r.a for r in spark.read.format("delta").load(path).collect()) == [1, 2, 3, 4]
    assert sorted(r.a for r in spark.read.format("delta").option("versionAsOf", 0).load(path).collect()) == [1, 2, 3]



def test_the_pom_compiles_with_pysparks_scala_and_refuses_another(tmp_path: Path) -> None:
    pom = Path(extension.__file__).resolve().parents[2] / "extension" / extension.POM_NAME
    extension.check_scala(pom, extension.pyspark_jars())  # the pinned pom builds against pyspark's Scala
    version = extension.scala_version(pom)
    other = tmp_path / extension.POM_NAME
    other.write_text(pom.read_text().replace(f"<scala.version>{version}<", "<scala.version>2.12.18<"))
    with pytest.raises(ConfigError, match=r"compiles with Scala 2\.12\.18 but pyspark ships scala-library-2\.13"):
        extension.check_scala(other, extension.pyspark_jars())
