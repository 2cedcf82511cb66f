"""Random differential streams, deterministic by seed: a plan, small tables, a partitioning and a change stream.

A *stream* is everything one differential run needs, as plain data that prints as its own reproduction:

* **generated** streams (odd seeds) take their plan, tables and partitions from the property tests' generators
  (``tests/engine/generators.py``: ``blocks``, ``rows_strategy``, ``partitions_strategy``, ``op_strategy``, drawn
  from a hypothesis ``ConjectureData`` seeded by the stream's seed), keeping plans the safety check accepts;
* **targeted** streams (even seeds) are the shapes the generated plans rarely reach: a ranking per group, an anti
  join under a HAVING COUNT, a float SUM and a DECIMAL(38, 0) SUM under a HAVING, a NOT IN over a float HAVING
  aggregation, over tables ``d`` and ``e`` with random thresholds and rows.

On top of the generators' change operations, every stream's batches draw the value classes that found issue 53:
rows identical in every column (``dup``), deletes of one copy of such a row (``delete_copy``), re-inserts of rows an
earlier batch deleted (``reinsert``), cancelling floats of very different magnitudes inserted in one file in the
order ``big, small, -big`` (``cancel``, the pair drawn once) whose large terms a later batch deletes (``uncancel``),
decimals near their type's precision (``near_max``, 6e37 in a DECIMAL(38, 0)), NULLs and NaNs (``odd``).

A batch is resolved to concrete rows when the stream is drawn (``Batch``: rows deleted, one copy each, then rows
appended in one file, in order), so a reproduction replays exactly.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis.control import BuildContext
from hypothesis.errors import StopTest
from hypothesis.internal.conjecture.data import ConjectureData

from imp_core.errors import ImpError
from imp_core.plan.safety import check
from imp_core.plan.sql import parse_query
from tests.engine.generators import (
    SCHEMAS,
    TABLES,
    Column,
    Row,
    Store,
    blocks,
    op_strategy,
    partitions_strategy,
    rows_strategy,
)

# --- the targeted tables --------------------------------------------------------------------------------------------

BIG_DECIMAL = Decimal("6e37")  # two of them overflow DECIMAL(38, 0)
TARGET_TABLES: dict[str, tuple[Column, ...]] = {
    "d": (
        Column("g", "int", (1, 2, 3), pa.int64(), "int"),
        Column("v", "float", (1.0, 2.0, 5.0, 10.0, 0.5), pa.float64(), "float", exact=False),
        Column("m", "dec", (Decimal(1), Decimal(-3), Decimal(7)), pa.decimal128(38, 0), "decimal", scale=0),
        Column("k", "int", (5, 6, 7, 8), pa.int64(), "int"),
    ),
    "e": (
        Column("k", "int", (5, 6, 7, 8), pa.int64(), "int"),
        Column("x", "float", (0.5, 1.0, 2.0), pa.float64(), "float", exact=False),
    ),
}
NEAR_MAX = {  # per (precision, scale): values whose sums of two leave or approach the type's range
    (38, 0): [BIG_DECIMAL, -BIG_DECIMAL, Decimal("99999999999999999999999999999999999999")],
    (10, 2): [Decimal("99999999.99"), Decimal("-99999999.99")],
    (18, 8): [Decimal("9999999999.99999999"), Decimal("-9999999999.99999999")],
}
BIG_FLOATS = (1e16, 1e17, 2.0**60)
SMALL_FLOATS = (1.0, 0.5, 3.0)


def columns(table: str) -> tuple[Column, ...]:
    return TARGET_TABLES[table] if table in TARGET_TABLES else TABLES[table]


def schema(table: str) -> pa.Schema:
    return pa.schema([(c.name, c.arrow) for c in columns(table)])


# --- streams --------------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One commit's worth of changes to the tables: per table, rows deleted (one copy each) and rows appended."""

    deleted: dict[str, list[Row]] = field(default_factory=dict)
    inserted: dict[str, list[Row]] = field(default_factory=dict)
    ops: list[str] = field(default_factory=list)  # what made it, for the reproduction

    def tables(self) -> list[str]:
        return sorted(set(self.deleted) | set(self.inserted))


@dataclass
class Stream:
    """A plan over tables with a partitioning and a change stream; prints as its reproduction."""

    seed: int
    family: str
    sql: str  # over the logical table names (d, e, r, s, u, x, y)
    initial: dict[str, list[Row]]
    on: list[str]  # table.column per partition
    bounds: list[str]  # the --bounds text per partition
    batches: list[Batch]
    compared: list[int] | None = None  # output columns a LIMIT without a total order determines (None: all)

    def reproduction(self) -> str:
        lines = [
            f"seed={self.seed} family={self.family}",
            f"SQL: {self.sql}",
            "on: " + " ".join(f"{o} bounds={b}" for o, b in zip(self.on, self.bounds)),
        ]
        lines += [f"table {t} {schema(t)}: {rows!r}".replace("\n", ", ") for t, rows in self.initial.items()]
        for i, b in enumerate(self.batches, 1):
            lines.append(f"batch {i} ({', '.join(b.ops)}): deleted={b.deleted!r} inserted={b.inserted!r}")
        return "\n".join(lines)


def draw_stream(seed: int, batches: int = 2) -> Stream:
    """The stream of ``seed``: targeted for even seeds, generated for odd ones; ``batches`` change batches."""
    rng = random.Random(seed)
    if seed % 2 == 0:
        return _targeted(seed, rng, batches)
    return _generated(seed, rng, batches)


# --- generated plans ------------------------------------------------------------------------------------------------


def _generated(seed: int, rng: random.Random, n_batches: int) -> Stream:
    """A plan from ``generators.blocks`` the safety check accepts (redrawn from derived seeds until one is)."""
    for attempt in range(200):
        data = ConjectureData(random=random.Random(seed * 1000 + attempt), max_choices=200_000)
        try:
            with BuildContext(data, is_final=True, wrapped_test=_generated):
                block = data.draw(blocks(rng.choice(["agg", "agg", "topk", "spj", "nested"]), max_tables=2))
                tables = sorted(set(block.tables()))
                parts = data.draw(partitions_strategy(tables))
                initial = {t: data.draw(rows_strategy(t, 12)) for t in tables}
                generator_ops = [
                    [data.draw(op_strategy(tables)) for _ in range(rng.randint(0, 2))] for _ in range(n_batches)
                ]
        except StopTest:
            continue
        sql = block.sql()
        bounds = _bounds_text(parts)
        if bounds is None or not _safe(sql, {p.table: p.column for p in parts.partitions}):
            continue
        compared = None
        if block.limit is not None and not block.total_order():
            compared = block.order_columns()
            if compared is None:
                continue
        store = Store({t: list(rows) for t, rows in initial.items()})
        batches = []
        for ops in generator_ops:
            before = {t: list(store.rows(t)) for t in tables}
            store.apply(ops, merge_duplicates=False)
            rows = {t: list(store.rows(t)) for t in tables}
            batch = _difference(before, rows, [op[0] for op in ops])
            batches.append(batch)
        stream = Stream(
            seed,
            "generated",
            sql,
            initial,
            [f"{p.table}.{p.column}" for p in parts.partitions],
            bounds,
            batches,
            compared,
        )
        _add_awkward(stream, rng)
        return stream
    raise AssertionError(f"seed {seed}: no safe generated plan in 200 draws")


def _safe(sql: str, partitions: dict[str, str]) -> bool:
    try:
        plan = parse_query(sql, SCHEMAS).plan
        return check(plan, partitions).safe
    except ImpError:
        return False


def _bounds_text(parts: Any) -> list[str] | None:
    """``--bounds`` per partition, or None when a bound does not survive the text round trip."""
    out = []
    for p in parts.partitions:
        texts = [b.isoformat(sep=" ") if p.kind == "timestamp" else str(b) for b in p.bounds]
        if any("," in t or t != t.strip() or not t for t in texts):
            return None
        out.append(",".join(texts))
    return out


# --- targeted plans -------------------------------------------------------------------------------------------------

SHAPES = ("rank", "anti", "fsum", "dsum", "notin")
# wide decimal sums whose Spark value depends on the order of the rows, in uses a guarded aggregation refuses (ORDER
# BY ... LIMIT) and a comparison keeps conservative, plain and DISTINCT: a third of the dsum streams, drawn apart from
# the stream's own random numbers so that the other streams (seed 6 among them) stay as they were
DSUM_VARIANTS = (
    "SELECT d.g, SUM(d.m) AS s FROM d AS d GROUP BY d.g HAVING SUM(DISTINCT d.m) > 0",
    "SELECT d.g, SUM(d.m) AS s FROM d AS d GROUP BY d.g ORDER BY s DESC, d.g LIMIT 2",
    "SELECT d.g, SUM(DISTINCT d.m) AS s FROM d AS d GROUP BY d.g ORDER BY s DESC, d.g LIMIT 2",
)


def dsum_variant(seed: int) -> int | None:
    """Which of ``DSUM_VARIANTS`` a dsum stream of ``seed`` runs, if any."""
    r = random.Random(f"variant-{seed}").randrange(3 * len(DSUM_VARIANTS))
    return r if r < len(DSUM_VARIANTS) else None


def targeted_sql(shape: str, rng: random.Random, variant: int | None = None) -> tuple[str, list[str], list[str]]:
    """The SQL of a targeted shape with random constants, the partition and its bounds (``variant``: one of
    ``DSUM_VARIANTS`` for the dsum shape)."""
    if shape == "rank":
        k, desc = rng.choice([1, 1, 2]), rng.choice(["DESC", "ASC"])
        sql = (
            f"SELECT x.g, x.v FROM (SELECT d.g, d.v, ROW_NUMBER() OVER (PARTITION BY d.g ORDER BY d.v {desc}) AS rn "
            f"FROM d AS d) AS x WHERE x.rn <= {k}"
        )
        return sql, ["d.v"], ["0,2,6,11"]
    if shape == "anti":
        n = rng.choice([1, 1, 2])
        sql = (
            f"SELECT d.g, COUNT(*) AS n FROM d AS d WHERE NOT EXISTS (SELECT 1 FROM e AS e WHERE e.k = d.k) "
            f"GROUP BY d.g HAVING COUNT(*) <= {n}"
        )
        return sql, ["d.g"], ["1,2,3,4"]
    if shape == "fsum":
        threshold = rng.choice(["0.5", "0.75", "2.5"])
        return f"SELECT d.g, COUNT(*) AS n FROM d AS d GROUP BY d.g HAVING SUM(d.v) > {threshold}", ["d.g"], ["1,2,3,4"]
    if shape == "dsum":
        cmp = rng.choice(["SUM(d.m) > 0", "SUM(d.m) >= 1", "SUM(d.m) < 0"])
        if variant is not None:
            return DSUM_VARIANTS[variant], ["d.g"], ["1,2,3,4"]
        return f"SELECT d.g, SUM(d.m) AS s FROM d AS d GROUP BY d.g HAVING {cmp}", ["d.g"], ["1,2,3,4"]
    threshold = rng.choice(["1.5", "0.5"])
    sql = (
        f"SELECT d.g, COUNT(*) AS n FROM d AS d WHERE d.k NOT IN (SELECT e.k FROM e AS e GROUP BY e.k "
        f"HAVING SUM(e.x) > {threshold}) GROUP BY d.g"
    )
    return sql, ["d.g"], ["1,2,3,4"]


def _targeted(seed: int, rng: random.Random, n_batches: int) -> Stream:
    shape = SHAPES[(seed // 2) % len(SHAPES)]
    sql, on, bounds = targeted_sql(shape, rng, dsum_variant(seed) if shape == "dsum" else None)
    tables = ["d", "e"] if shape in ("anti", "notin") else ["d"]
    initial: dict[str, list[Row]] = {}
    for t in tables:
        rows = [tuple(rng.choice(c.domain) for c in columns(t)) for _ in range(rng.randint(3, 6))]
        rows += [rows[0]] * rng.randint(1, 2)  # a row identical in every column
        initial[t] = rows
    batches = [Batch() for _ in range(n_batches)]
    stream = Stream(seed, f"targeted:{shape}", sql, initial, on, bounds, batches)
    _add_awkward(stream, rng, weight=3)
    return stream


# --- the awkward changes --------------------------------------------------------------------------------------------


def _key(row: Row) -> tuple[Any, ...]:
    """A row as a hashable value under which every NaN is one value (``nan != nan``, and hashes by identity)."""
    return tuple(
        "NaN" if isinstance(v, float) and math.isnan(v) else (v, math.copysign(1, v)) if isinstance(v, float) else v
        for v in row
    )


def _difference(before: dict[str, list[Row]], after: dict[str, list[Row]], ops: list[str]) -> Batch:
    """The batch that turns ``before`` into ``after`` (bags): deleted and inserted rows per table."""
    batch = Batch(ops=list(ops))
    for t in after:
        left = {}
        for r in before[t]:
            left.setdefault(_key(r), []).append(r)
        inserted = []
        for r in after[t]:
            same = left.get(_key(r))
            if same:
                same.pop()
            else:
                inserted.append(r)
        deleted = [r for rows in left.values() for r in rows]
        if deleted:
            batch.deleted[t] = deleted
        if inserted:
            batch.inserted[t] = inserted
    return batch


AWKWARD = ("dup", "delete_copy", "reinsert", "cancel", "uncancel", "near_max", "odd")


def _add_awkward(stream: Stream, rng: random.Random, weight: int = 2) -> None:  # noqa: C901
    """Add the awkward changes to every batch of ``stream`` (replaying the batches over the initial rows)."""
    rows = {t: list(r) for t, r in stream.initial.items()}
    deleted: dict[str, list[Row]] = {}
    cancels: list[tuple[str, list[Row]]] = []
    for batch in stream.batches:
        for t in batch.tables():  # the generators' own changes first
            for r in batch.deleted.get(t, []):
                _remove(rows[t], r)
                deleted.setdefault(t, []).append(r)
            rows[t] += batch.inserted.get(t, [])
        for _ in range(rng.randint(1, weight)):
            kind = rng.choice(AWKWARD)
            if kind == "uncancel" and cancels:
                t, big = cancels.pop(rng.randrange(len(cancels)))
                for r in big:
                    if _remove(rows[t], r):
                        batch.deleted.setdefault(t, []).append(r)
                batch.ops.append("uncancel")
                continue
            t = rng.choice(sorted(rows))
            new, gone = _awkward(kind, t, rows[t], deleted.get(t, []), rng, cancels)
            if not new and not gone:
                continue
            for r in gone:
                _remove(rows[t], r)
                deleted.setdefault(t, []).append(r)
            rows[t] += new
            batch.deleted.setdefault(t, []).extend(gone)
            batch.inserted.setdefault(t, []).extend(new)
            batch.ops.append(f"{kind}({t})")
        _net(batch)
        if not batch.tables():  # every batch changes something: one more copy of a row
            t = rng.choice(sorted(t for t in rows if rows[t]) or sorted(rows))
            row = rng.choice(rows[t]) if rows[t] else tuple(rng.choice(c.domain) for c in columns(t))
            rows[t].append(row)
            batch.inserted[t] = [row]
            batch.ops.append(f"dup({t})")


def _awkward(
    kind: str, t: str, rows: list[Row], gone_before: list[Row], rng: random.Random, cancels: list[tuple[str, list[Row]]]
) -> tuple[list[Row], list[Row]]:
    """Rows inserted and deleted by one awkward change of table ``t`` (whose rows are ``rows``)."""
    cols = columns(t)
    if kind == "dup" and rows:
        r = rng.choice(rows)
        return [r] * rng.randint(1, 2), []
    if kind == "delete_copy" and rows:
        counts: dict[Any, int] = {}
        for r in rows:
            counts[_key(r)] = counts.get(_key(r), 0) + 1
        copies = [r for r in rows if counts[_key(r)] > 1]
        return [], [rng.choice(copies or rows)]
    if kind == "reinsert" and gone_before:
        return [rng.choice(gone_before)], []
    floats = [i for i, c in enumerate(cols) if c.kind == "float" and c.arrow == pa.float64()]
    if kind == "cancel" and floats:
        i = rng.choice(floats)
        base = rng.choice(rows) if rows else tuple(rng.choice(c.domain) for c in cols)
        big, small = rng.choice(BIG_FLOATS), rng.choice(SMALL_FLOATS)  # the pair drawn once: big and -big
        triple = [base[:i] + (v,) + base[i + 1 :] for v in (big, small, -big)]
        cancels.append((t, [triple[0], triple[2]]))
        return triple, []
    decimals = [i for i, c in enumerate(cols) if c.kind == "dec"]
    if kind == "near_max" and decimals:
        i = rng.choice(decimals)
        arrow = cols[i].arrow
        values = NEAR_MAX[(arrow.precision, arrow.scale)]
        base = rng.choice(rows) if rows else tuple(rng.choice(c.domain) for c in cols)
        value = values[0] if rng.random() < 0.6 else rng.choice(values)
        return [base[:i] + (value,) + base[i + 1 :] for _ in range(2)], []
    if kind == "odd":
        base = list(rng.choice(rows) if rows else tuple(rng.choice(c.domain) for c in cols))
        i = rng.randrange(len(cols))
        base[i] = math.nan if i in floats and rng.random() < 0.5 else None
        return [tuple(base)], []
    return [], []


def _remove(rows: list[Row], row: Row) -> bool:
    key = _key(row)
    for i, r in enumerate(rows):
        if _key(r) == key:
            del rows[i]
            return True
    return False


def _net(batch: Batch) -> None:
    """Drop a row both inserted and deleted in one batch (a Delta commit cannot delete a row it appends)."""
    for t in list(batch.inserted):
        inserted, deleted = batch.inserted[t], batch.deleted.get(t, [])
        for r in list(inserted):
            if _remove(deleted, r):
                _remove(inserted, r)
    for part in (batch.inserted, batch.deleted):
        for t in [t for t, rows in part.items() if not rows]:
            del part[t]


def renamed(sql: str, suffix: str) -> str:
    """``sql`` with each logical table name made the stream's own (``d`` -> ``d_<suffix>``)."""
    names = "|".join(sorted(set(TABLES) | set(TARGET_TABLES)))
    return re.sub(rf"(?<![.\w`])({names}) AS ", lambda m: f"{m.group(1)}_{suffix} AS ", sql)
