"""Two small tables T1(g, v) and T2(g, v), partitioned on g, and a query maintained under random changes to both:
after every pass the maintained sketch equals a fresh capture, the engine's answer equals DuckDB's answer to the same
SQL, and (when the safety check says the partition is safe) DuckDB's answer over only the sketch's fragments equals its
answer over everything."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine.annotation import as_sets
from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.safety import check
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet

SCHEMA = pa.schema([("g", pa.int64()), ("v", pa.int64())])
VERSIONS = {"T1": 0, "T2": 0}


def rows(g: list[int], v: list[int], mult: list[int] | None = None) -> pl.DataFrame:
    df = pl.DataFrame({"g": g, "v": v}, schema={"g": pl.Int64, "v": pl.Int64})
    return df if mult is None else df.with_columns(pl.Series(MULT, mult, dtype=pl.Int64))


def apply(table: pl.DataFrame, change: pl.DataFrame) -> pl.DataFrame:
    out = table
    for g, v, m in change.rows():
        if m > 0:
            out = pl.concat([out, rows([g] * m, [v] * m)])
        else:
            at = out.with_row_index().filter((pl.col("g") == g) & (pl.col("v") == v)).get_column("index")[:(-m)]
            out = out.with_row_index().filter(~pl.col("index").is_in(at.implode())).drop("index")
    return out


def parts(partitioned: tuple[str, ...] = ("T1", "T2")) -> PartitionSet:
    """``g`` in [0, 5) and [5, 10) of each partitioned table (fragments numbered in that order: T1 0-1, T2 2-3)."""
    return PartitionSet(tuple(Partition(t, "g", (0, 5, 10), "int") for t in partitioned))


def duck(sql: str, tables: dict[str, pl.DataFrame], sketch: set[int] | None = None,
         partitioned: tuple[str, ...] = ("T1", "T2")) -> Counter:
    """DuckDB's answer, with the partitioned tables restricted to the rows in ``sketch``'s fragments when given."""
    con = duckdb.connect()
    con.execute("SET default_null_order='nulls_first_on_asc_last_on_desc'")  # Spark's: NULLs are the smallest
    try:
        for name, df in sorted(tables.items()):
            if sketch is not None and name in partitioned:
                i = sorted(partitioned).index(name)
                frag = pl.when(pl.col("g") < 5).then(2 * i).otherwise(2 * i + 1)
                df = df.filter(frag.is_in(sorted(sketch)))
            con.register(name, df.to_arrow())
        return Counter(tuple(float(x) if isinstance(x, (int, float)) or hasattr(x, "as_tuple") else x for x in r)
                       for r in con.execute(sql).fetchall())
    finally:
        con.close()


def engine_answer(pipe: Pipeline, backend: LocalBackend) -> Counter:
    rel = as_sets(backend.relation(pipe.as_relation(pipe.plan), VERSIONS))
    data = rel.drop([MULT, "__sk"])
    out: Counter = Counter()
    for row, m in zip(data.iter_rows(), rel.get_column(MULT).to_list()):
        out[tuple(float(x) if isinstance(x, (int, float)) or hasattr(x, "as_tuple") else x for x in row)] += m
    return +out


def reader(tables: dict[str, pl.DataFrame]) -> Callable[[str, int], pl.DataFrame]:
    return lambda name, version: tables[name]


def maintained_like_a_recapture(sql: str, seed: int = 11, rounds: int = 8,
                                partitioned: tuple[str, ...] = ("T1", "T2")) -> bool:
    """The checks of the module docstring, after each of ``rounds`` random passes; returns whether the partition
    was safe (the sketch's sufficiency was checked)."""
    plan = parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA}).plan
    partition = parts(partitioned)
    safe = check(plan, {t: "g" for t in partitioned}).safe
    rng = np.random.default_rng(seed)
    tables = {"T1": rows(rng.integers(0, 10, 8).tolist(), rng.integers(-5, 15, 8).tolist()),
              "T2": rows(rng.integers(0, 10, 8).tolist(), rng.integers(-5, 15, 8).tolist())}
    pipe = Pipeline(plan, partition)
    pipe.capture(LocalBackend(reader(tables)), VERSIONS)
    for _ in range(rounds):
        table = str(rng.choice(["T1", "T2"]))
        current = tables[table]
        ins = rows(rng.integers(0, 10, 3).tolist(), rng.integers(-5, 15, 3).tolist(), [1] * 3)
        dels = current.sample(min(2, current.height), seed=int(rng.integers(1 << 30))).with_columns(
            pl.lit(-1, dtype=pl.Int64).alias(MULT))
        change = pl.concat([ins, dels])
        tables[table] = apply(current, change)
        backend = LocalBackend(reader(tables))
        pipe.maintain_pass(table, change, backend, VERSIONS)
        fresh = Pipeline(plan, partition)
        fresh.capture(backend, VERSIONS)
        assert pipe.sketch() == fresh.sketch()
        expected = duck(sql, tables)
        assert engine_answer(pipe, backend) == expected
        if safe:
            assert duck(sql, tables, pipe.sketch(), partitioned) == expected, pipe.sketch()
    return safe
