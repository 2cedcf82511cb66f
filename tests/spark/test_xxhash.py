"""Spark's xxhash64 computed in the driver (imp_core/spark/xxhash.py) against Spark's own: a wrong bucket would make
a fetch skip the partition that holds a key's state, so every supported type is checked, NULLs and several columns
included, and a single-key store's fetch through the driver's buckets against the memory store."""

from __future__ import annotations

import datetime
import random
from pathlib import Path

import polars as pl
import pytest
from pyspark.sql import functions as F

from imp_core.engine.external import GROUPS, MemoryGroupStore
from imp_core.spark import xxhash
from imp_core.spark.frames import to_polars, to_spark
from imp_core.spark.state_store import BUCKET, DeltaGroupStore

pytestmark = [pytest.mark.spark]


def _values(rng: random.Random, n: int) -> pl.DataFrame:
    def maybe(v: object) -> object:
        return None if rng.random() < 0.1 else v

    return pl.DataFrame({
        "long": pl.Series([maybe(rng.randint(-2**63, 2**63 - 1)) for _ in range(n)], dtype=pl.Int64),
        "int": pl.Series([maybe(rng.randint(-2**31, 2**31 - 1)) for _ in range(n)], dtype=pl.Int32),
        "short": pl.Series([maybe(rng.randint(-2**15, 2**15 - 1)) for _ in range(n)], dtype=pl.Int16),
        "byte": pl.Series([maybe(rng.randint(-128, 127)) for _ in range(n)], dtype=pl.Int8),
        "date": pl.Series([maybe(datetime.date(1992, 1, 1) + datetime.timedelta(days=rng.randint(-9000, 9000)))
                           for _ in range(n)], dtype=pl.Date),
        "bool": pl.Series([maybe(rng.random() < 0.5) for _ in range(n)], dtype=pl.Boolean),
        # lengths across XXH64's 32-, 8-, 4- and 1-byte steps, multi-byte characters included
        "text": pl.Series([maybe("".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0x2FFF)]))
                                         for _ in range(rng.randint(0, 80)))) for _ in range(n)], dtype=pl.String),
    })


@pytest.mark.parametrize("columns", [["long"], ["int"], ["short"], ["byte"], ["date"], ["bool"], ["text"],
                                     ["long", "text"], ["date", "int", "bool"],
                                     ["long", "int", "short", "byte", "date", "bool", "text"]])
def test_the_driver_hashes_keys_as_spark_does(spark, columns: list[str]) -> None:  # noqa: ANN001
    df = _values(random.Random(len(columns) * 7 + len(columns[0])), 600).select(columns)
    spark_hash = to_polars(to_spark(spark, df.with_row_index("i"))
                           .select("i", F.xxhash64(*[F.col(c) for c in columns]).alias("h")).orderBy("i"))
    assert xxhash.xxhash64(df).tolist() == spark_hash.get_column("h").to_list()
    mine = xxhash.buckets(df, 7)
    theirs = to_polars(to_spark(spark, df).select(F.pmod(F.xxhash64(*[F.col(c) for c in columns]), F.lit(7))
                                                  .alias("b")).distinct())
    assert mine == sorted(theirs.get_column("b").to_list())


def test_a_type_the_driver_cannot_hash_is_left_to_spark() -> None:
    assert xxhash.xxhash64(pl.DataFrame({"k": [1], "x": [1.5]})) is None
    assert xxhash.buckets(pl.DataFrame({"t": [datetime.datetime(2020, 1, 1)]}), 4) is None


@pytest.mark.parametrize("key_type", [pl.Int64, pl.Date, pl.String, pl.Float64])
def test_a_single_key_store_fetches_what_the_memory_store_does(spark, tmp_path: Path, key_type: pl.DataType,  # noqa: ANN001
                                                              monkeypatch) -> None:  # noqa: ANN001
    """One key column: the fetch filters by the keys as literals (a float key: its buckets from Spark, and a join),
    the stored rows' buckets are the driver's, and more keys than ``LITERAL_KEYS`` take the join."""
    from imp_core.spark import state_store

    schemas = {GROUPS: {"k": key_type, "__n": pl.Int64}}
    raw = [None, *range(0, 400, 3)]
    keys = pl.Series("k", raw).cast(pl.Int64)
    typed = {pl.Date: lambda s: s.cast(pl.Date), pl.String: lambda s: s.cast(pl.String),
             pl.Float64: lambda s: s.cast(pl.Float64)}.get(key_type, lambda s: s)(keys)
    start = {GROUPS: pl.DataFrame({"k": typed, "__n": pl.Series(range(len(raw)), dtype=pl.Int64)})}
    memory = MemoryGroupStore(["k"], schemas)
    delta = DeltaGroupStore(spark, str(tmp_path / "state"), ["k"], schemas, buckets=5)
    for store in (memory, delta):
        store.load(start)
    stored = to_polars(delta._table().select("k", BUCKET))
    if xxhash.supported(key_type):
        assert stored.get_column(BUCKET).to_list() == \
            [xxhash.buckets(stored.slice(i, 1).select("k"), 5)[0] for i in range(stored.height)]  # type: ignore[index]
    absent = {pl.Date: pl.Series([1000]).cast(pl.Date), pl.String: pl.Series(["x"]),
              pl.Float64: pl.Series([0.5])}.get(key_type, pl.Series([1000]))
    wanted = pl.DataFrame({"k": typed.gather([0, 1, 5, 40, 7]).append(absent.cast(key_type))})
    for limit in (state_store.LITERAL_KEYS, 2):
        monkeypatch.setattr(state_store, "LITERAL_KEYS", limit)
        for batch in (wanted, wanted.head(0), wanted.tail(1)):
            got, expected = delta.fetch(batch)[GROUPS], memory.fetch(batch)[GROUPS]
            assert got.sort("__n").equals(expected.sort("__n")), (limit, batch)
    assert delta.fetch(wanted)[GROUPS].height == 5  # NULL's group included, the absent key not
