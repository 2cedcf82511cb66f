"""Annotated deltas: helpers over the annotation columns, and how a plan's scans are annotated.

See docs/ARCHITECTURE.md, "Annotated deltas"; the column names are defined in ``imp_core.engine.schema``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine.evaluate import polars_type
from imp_core.engine.schema import (
    FRAG,
    MULT,
    RIGHT_SET,
    SET,
    annotation_columns,
    frag_col,
    is_annotation,
    raw_col,
)
from imp_core.errors import StateError
from imp_core.plan.nodes import Plan, Scan
from imp_core.sketch.partition import Partition, PartitionSet

FRAG_DTYPE = pl.UInt32()
SMALL_BATCH = 32_768  # up to this many rows NumPy's sorts beat polars' (parallel) group-bys on this machine
SET_DTYPE = pl.List(pl.UInt32)


def ann_cols(df: pl.DataFrame) -> list[str]:
    return annotation_columns(df.columns)


def data_cols(df: pl.DataFrame) -> list[str]:
    return [c for c in df.columns if c != MULT and not is_annotation(c)]


def set_expr(columns: list[str]) -> pl.Expr:
    """An expression giving the annotation of each row as a sorted, duplicate-free ``List[UInt32]``."""
    if not columns:
        return pl.lit([], dtype=SET_DTYPE)
    parts = [pl.col(c) if c == SET else pl.concat_list(pl.col(c)) for c in columns]
    combined = parts[0] if len(parts) == 1 else pl.concat_list(parts)
    if len(columns) == 1:  # a set column already is a set; one fragment column gives one-element lists
        if columns[0] == SET:
            return combined.cast(SET_DTYPE)
        # a NULL fragment (a union row from a branch without this scan) is no fragment
        return pl.when(pl.col(columns[0]).is_null()).then(pl.lit([], dtype=SET_DTYPE)).otherwise(
            combined.cast(SET_DTYPE))
    return _unique_sorted(combined)


def _unique_sorted(lists: pl.Expr) -> pl.Expr:
    """Each list sorted and duplicate-free, as ``SET_DTYPE``. (``list.eval`` rather than ``list.sort``: polars
    2.1's ``list.sort`` costs about 14 ms per 1,000 short lists on this machine, the ``eval`` form under 1 ms.)"""
    return lists.list.eval(pl.element().drop_nulls().unique().sort()).cast(SET_DTYPE)


def as_sets(df: pl.DataFrame) -> pl.DataFrame:
    """The same delta with its annotation folded into one ``__sk`` set column."""
    cols = ann_cols(df)
    if cols == [SET]:
        return df
    return df.with_columns(set_expr(cols).alias(SET)).drop([c for c in cols if c != SET])


def pairs(df: pl.DataFrame, keep: list[str]) -> pl.DataFrame:
    """One row per (row, fragment) with the ``keep`` columns, ``__frag`` and ``__mult``.

    This is what every counting operator needs (``F_g`` in aggregation, the merge operator's counts): a fragment
    column row contributes one pair per scan, a set row one pair per fragment in its set. A NULL fragment column
    (a row of a UNION ALL branch without that scan) contributes nothing.
    """
    return pairs_lazy(df.lazy(), keep).collect(engine="in-memory")


def pairs_lazy(df: pl.LazyFrame, keep: list[str]) -> pl.LazyFrame:
    """``pairs`` as a lazy query, for callers that go on with it (one lazy run replaces several eager steps)."""
    schema = df.collect_schema()
    cols = [c for c in schema.names() if is_annotation(c)]
    if not cols:
        return pl.LazyFrame(schema={**{k: schema[k] for k in keep}, FRAG: FRAG_DTYPE, MULT: pl.Int64})
    parts = []
    for c in cols:
        if c == SET:
            part = df.select([*keep, pl.col(SET).alias(FRAG), MULT]).explode(FRAG)
            part = part.filter(pl.col(FRAG).is_not_null())
        else:
            part = df.select([*keep, pl.col(c).alias(FRAG), MULT]).filter(pl.col(FRAG).is_not_null())
        parts.append(part.with_columns(pl.col(FRAG).cast(FRAG_DTYPE)))
    return pl.concat(parts) if len(parts) > 1 else parts[0]


def rename_for_join(left: pl.DataFrame, right: pl.DataFrame) -> pl.DataFrame:
    """Renumber the right side's fragment columns so they do not collide with the left side's."""
    used = {c for c in ann_cols(left) if c != SET}
    n = len(used)
    mapping = {}
    for c in ann_cols(right):
        if c == SET:
            mapping[c] = RIGHT_SET
        else:
            while frag_col(n) in used:
                n += 1
            mapping[c] = frag_col(n)
            used.add(frag_col(n))
            n += 1
    return right.rename(mapping) if mapping else right


def after_join(df: pl.DataFrame) -> pl.DataFrame:
    """Union the annotations of a joined row (paper 5.2.4: ``P1 ∪ P2``).

    If neither side had a set, the fragment columns of both sides simply sit next to each other (still one fragment
    per scan). Otherwise everything folds into one ``__sk``.
    """
    cols = [c for c in df.columns if is_annotation(c) or c == RIGHT_SET]
    if SET not in cols and RIGHT_SET not in cols:
        return df
    parts = [pl.col(c) if c in (SET, RIGHT_SET) else pl.concat_list(pl.col(c)) for c in cols]
    expr = _unique_sorted(pl.concat_list(parts) if len(parts) > 1 else parts[0])
    tmp = "__sk_new"
    return df.with_columns(expr.alias(tmp)).drop(cols).rename({tmp: SET})


def empty_delta(schema: dict[str, pl.DataType], annotation: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema={**schema, MULT: pl.Int64, **annotation})


def annotation_schema(df: pl.DataFrame) -> dict[str, pl.DataType]:
    return {c: df.schema[c] for c in ann_cols(df)}


def consolidate(df: pl.DataFrame) -> pl.DataFrame:
    """Net out a delta: sum multiplicities of identical (row, annotation) pairs and drop those that cancel.

    This is MinShip's netting (Liu et al.) applied to annotated deltas: an insert and a delete of the same row in one
    batch disappear, duplicates collapse into one row with a multiplicity.
    """
    if df.height <= 1:
        return df.filter(pl.col(MULT) != 0) if df.height else df
    keys = [c for c in df.columns if c != MULT]
    # nothing to net but zeros when no two rows agree: small batches decide it in NumPy, large ones by a column of
    # distinct integers (one sort, ~1 ms on 100K rows) or else by distinct row hashes (polars' parallel hash count:
    # ~5 ms on 100K rows against ~19 ms for the group-by)
    if _distinct_rows(df, keys) if df.height <= SMALL_BATCH else (
            _distinct_integers([df.get_column(k) for k in keys]) or
            df.select(keys).hash_rows().n_unique() == df.height):
        m = df.get_column(MULT).to_numpy()
        return df.filter(pl.Series(m != 0)) if (m == 0).any() else df
    return (df.lazy().group_by(keys, maintain_order=True).agg(pl.col(MULT).sum())
            .filter(pl.col(MULT) != 0).select(df.columns).collect(engine="in-memory"))


def _distinct_rows(df: pl.DataFrame, keys: list[str]) -> bool:
    """Whether no two rows of ``df`` agree on every ``keys`` column, decided cheaply: by a NumPy sort when every
    column is plain numbers without NULL (a polars group-by costs ~0.4 ms on 1,000 rows, this ~0.05 ms), else by
    row hashes. False may be wrong (equal hashes, NaN); the caller then nets by a group-by, which is exact."""
    columns = [df.get_column(k) for k in keys]
    if all(c.dtype.is_numeric() and not c.dtype.is_decimal() and not c.null_count() for c in columns):
        if _distinct_integers(columns):
            return True
        arrays = [c.to_numpy() for c in columns]
        order = np.lexsort(arrays)
        same = np.ones(order.size - 1, dtype=bool)
        for a in arrays:
            ordered = a[order]
            same &= ordered[1:] == ordered[:-1]
        return not same.any()
    return bool(np.unique(pl.DataFrame(columns).hash_rows()).size == df.height)


def _distinct_integers(columns: list[pl.Series]) -> bool:
    """Whether the first integer column without NULL holds distinct values (a key): then no two rows agree. One
    sort; False says nothing."""
    first = next((c for c in columns if c.dtype.is_integer() and not c.null_count()), None)
    if first is None or first.len() < 2:
        return False
    ordered = np.sort(first.to_numpy())
    return not (ordered[1:] == ordered[:-1]).any()


def relabel(df: pl.DataFrame, mapping: np.ndarray) -> pl.DataFrame:
    """``df`` with every fragment id in its annotation columns (``__f{i}``, ``__frag``, ``__sk``) replaced by
    ``mapping[id]``: how operator state follows a repartition (paper 7.4) without recomputing anything.

    ``mapping`` must be strictly increasing on the ids ``df`` holds, so a set stays sorted and duplicate-free.

    Raises:
        StateError: An id is outside ``mapping``, or two ids in use map to one.
    """
    out = []
    for name in df.columns:
        col = df.get_column(name)
        if (name == FRAG or is_annotation(name) and name != SET) and col.null_count():
            # NULL: no fragment of this scan (a UNION ALL row of another branch); stays NULL
            valid = col.is_not_null()
            ids = np.zeros(col.len(), dtype=np.uint32)
            ids[valid.to_numpy()] = _mapped(col.drop_nulls().to_numpy(), mapping)
            out.append(pl.select(pl.when(valid).then(pl.Series(ids, dtype=FRAG_DTYPE))).to_series().alias(name))
        elif name == FRAG or is_annotation(name) and name != SET:
            out.append(pl.Series(name, _mapped(col.to_numpy(), mapping), dtype=FRAG_DTYPE))
        elif name == SET:
            lengths = col.list.len().fill_null(0).to_numpy().astype(np.int64)
            flat = col.explode(keep_nulls=False, empty_as_null=False).to_numpy()
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()),
                                                  pa.array(_mapped(flat, mapping), pa.uint32()))
            mapped = pl.Series(name, lists, dtype=SET_DTYPE)
            out.append(mapped if not col.null_count() else
                       pl.select(pl.when(col.is_null()).then(None).otherwise(mapped).alias(name)).to_series())
        else:
            out.append(col)
    return pl.DataFrame(out)


def _mapped(ids: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    if ids.size == 0:
        return ids.astype(np.uint32)
    used = np.unique(ids.astype(np.int64))
    if used[0] < 0 or used[-1] >= mapping.size:
        raise StateError(f"fragment id {int(used[-1])} is outside the repartition's mapping ({mapping.size} ids); "
                         f"recapture the sketch")
    if used.size > 1 and not (np.diff(mapping[used]) > 0).all():
        raise StateError("a repartition would map two fragment ids in use to one; recapture the sketch")
    return mapping[ids.astype(np.int64)].astype(np.uint32)


# -- how a plan's scans are annotated ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ScanAnnotation:
    """How the rows of one partitioned scan are annotated: fragment column, partition, global id of its first
    fragment."""

    scan: Scan
    column: str
    partition: Partition
    offset: int

    @property
    def raw_column(self) -> str:
        """The column that carries the raw partition value until it becomes ``column``."""
        return raw_col(self.column)

    @property
    def value_type(self) -> pl.DataType:
        """The engine's storage type of the partition column's values."""
        return polars_type(next(c.dtype for c in self.scan.columns if c.name == self.partition.column))

    def fragments(self, values: pl.Series) -> np.ndarray:
        """Global fragment ids of partition-column values."""
        return self.partition.fragment_of(values) + self.offset


@dataclass(frozen=True)
class AnnotationLayout:
    """The annotation of every partitioned scan of a plan; scan ``i`` (in plan order) gets fragment column ``__f{i}``.

    Scans are matched by identity: two equal subtrees of one plan (the same table under the same alias in two
    subqueries) are still two scans with their own fragment columns.
    """

    scans: tuple[ScanAnnotation, ...]
    total_fragments: int

    @classmethod
    def of(cls, plan: Plan, partitions: PartitionSet) -> AnnotationLayout:
        out: list[ScanAnnotation] = []
        for scan in plan.scans():
            part = partitions.get(scan.table)
            if part is not None:
                out.append(ScanAnnotation(scan, frag_col(len(out)), part, partitions.offset(scan.table)))
        return cls(tuple(out), partitions.total_fragments)

    def of_scan(self, scan: Scan) -> ScanAnnotation | None:
        return next((a for a in self.scans if a.scan is scan), None)

    def resolve_raw(self, df: pl.DataFrame) -> pl.DataFrame:
        """``df`` with every raw partition-value column ``__p{i}`` replaced by its fragment column ``__f{i}``."""
        for ann in self.scans:
            if ann.raw_column not in df.columns:
                continue
            values = df.get_column(ann.raw_column).cast(ann.value_type, strict=False)
            df = df.with_columns(pl.Series(ann.column, ann.fragments(values), dtype=FRAG_DTYPE)).drop(ann.raw_column)
        return df


__all__ = ["FRAG_DTYPE", "SET_DTYPE", "AnnotationLayout", "ScanAnnotation", "after_join", "ann_cols", "as_sets",
           "consolidate", "data_cols", "empty_delta", "pairs", "pairs_lazy", "relabel", "rename_for_join", "set_expr"]
