"""Annotated deltas: change rows with a signed multiplicity and the fragments each row depends on.

An annotated delta (paper Section 4.3) is a polars DataFrame with

* the plan's columns,
* ``__mult``: signed multiplicity (``+n`` = n inserted copies, ``-n`` = n deleted copies; bag semantics), and
* annotation columns, in one of two representations that operator code never has to tell apart:

  - **fragment columns** ``__f0, __f1, ...`` (``UInt32``): below the first aggregation every row depends on exactly
    one fragment per partitioned scan, so one integer column per scan is enough and costs nothing to carry;
  - **fragment sets** ``__sk`` (``List[UInt32]``, sorted, unique): above an aggregation a row (a group) depends on
    any number of fragments.

Fragment ids are global (see ``imp_core.sketch.partition``), so the union of annotations is a plain set union.
Operators use the helpers below: ``pairs`` (row, fragment) for counting, ``as_sets`` for identity, and
``after_join`` to union both sides' annotations.
"""

from __future__ import annotations

import polars as pl

MULT = "__mult"
SET = "__sk"
FRAG_PREFIX = "__f"
FRAG = "__frag"  # the fragment column of exploded (row, fragment) pairs
ROW = "__row"

FRAG_DTYPE = pl.UInt32
SET_DTYPE = pl.List(pl.UInt32)


def is_annotation(name: str) -> bool:
    return name == SET or (name.startswith(FRAG_PREFIX) and name[len(FRAG_PREFIX):].isdigit())


def ann_cols(df: pl.DataFrame) -> list[str]:
    return [c for c in df.columns if is_annotation(c)]


def data_cols(df: pl.DataFrame) -> list[str]:
    return [c for c in df.columns if c != MULT and not is_annotation(c)]


def frag_col(index: int) -> str:
    return f"{FRAG_PREFIX}{index}"


def set_expr(columns: list[str]) -> pl.Expr:
    """An expression giving the annotation of each row as a sorted, duplicate-free ``List[UInt32]``."""
    if not columns:
        return pl.lit([], dtype=SET_DTYPE)
    parts = [pl.col(c) if c == SET else pl.concat_list(pl.col(c)) for c in columns]
    combined = parts[0] if len(parts) == 1 else pl.concat_list(parts)
    if columns == [SET]:
        return combined.cast(SET_DTYPE)
    return combined.list.unique().list.sort().cast(SET_DTYPE)


def as_sets(df: pl.DataFrame) -> pl.DataFrame:
    """The same delta with its annotation folded into one ``__sk`` set column."""
    cols = ann_cols(df)
    if cols == [SET]:
        return df
    return df.with_columns(set_expr(cols).alias(SET)).drop([c for c in cols if c != SET])


def pairs(df: pl.DataFrame, keep: list[str]) -> pl.DataFrame:
    """One row per (row, fragment) with the ``keep`` columns, ``__frag`` and ``__mult``.

    This is what every counting operator needs (``F_g`` in aggregation, the merge operator's counts): a fragment
    column row contributes one pair per scan, a set row one pair per fragment in its set.
    """
    return pairs_lazy(df.lazy(), keep).collect(engine="in-memory")


def pairs_lazy(df: pl.LazyFrame, keep: list[str]) -> pl.LazyFrame:
    """``pairs`` as a lazy query, for callers that go on with it: on deltas of a few thousand rows the fixed cost
    of each eager polars step is most of the work, and one lazy run replaces several steps."""
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
            part = df.select([*keep, pl.col(c).alias(FRAG), MULT])
        parts.append(part.with_columns(pl.col(FRAG).cast(FRAG_DTYPE)))
    return pl.concat(parts) if len(parts) > 1 else parts[0]


def rename_for_join(left: pl.DataFrame, right: pl.DataFrame) -> pl.DataFrame:
    """Renumber the right side's fragment columns so they do not collide with the left side's."""
    used = {c for c in ann_cols(left) if c != SET}
    n = len(used)
    mapping = {}
    for c in ann_cols(right):
        if c == SET:
            mapping[c] = "__sk_r"
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
    cols = [c for c in df.columns if is_annotation(c) or c == "__sk_r"]
    if SET not in cols and "__sk_r" not in cols:
        return df
    parts = [pl.col(c) if c in (SET, "__sk_r") else pl.concat_list(pl.col(c)) for c in cols]
    expr = (pl.concat_list(parts) if len(parts) > 1 else parts[0]).list.unique().list.sort().cast(SET_DTYPE)
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
    return (df.lazy().group_by(keys, maintain_order=True).agg(pl.col(MULT).sum())
            .filter(pl.col(MULT) != 0).select(df.columns).collect(engine="in-memory"))
