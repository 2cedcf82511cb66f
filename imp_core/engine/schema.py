"""The annotated-delta schema: reserved column names, fragment columns and the order of a join's output.

Every module that builds or reads an annotated delta (the engine's operators, the Spark compiler and backend, the
change-feed readers) takes these names from here. See docs/ARCHITECTURE.md, "Annotated deltas".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MULT = "__mult"  # signed multiplicity: +n inserts n copies, -n deletes n
SET = "__sk"  # a row's fragments as a sorted, duplicate-free List[UInt32] (above an aggregation)
FRAG_PREFIX = "__f"  # __f{i}: the fragment of partitioned scan i (UInt32), below the first aggregation; NULL: none (a
# UNION ALL row of a branch without scan i)
RAW_PREFIX = "__p"  # __p{i}: scan i's raw partition value, carried from Spark and turned into __f{i} in memory
FRAG = "__frag"  # the fragment of one exploded (row, fragment) pair
REFRAG = "__refrag"  # a change row's global fragment id set by the caller (a repartition moving rows between ids)
COUNT = "__n"  # a count per key: F_g per (group, fragment), MIN/MAX values per (group, value), join-key counts
VALUE = "__v"  # a value of a MIN/MAX multiset
ROW = "__row"  # a row's index in operator state
GROUP_ROWS = "__cnt"  # rows in an aggregation's group (bag count)
NO_GROUP = "__gk"  # the constant key of an aggregation without GROUP BY
NAN_FLAG_PREFIX = "__isnan__"  # __isnan__<key>: a float key is NaN (the key column then holds 0.0)

# the right input's columns while both inputs of a join sit side by side
RIGHT_MULT = "__mult_r"
RIGHT_SET = "__sk_r"

# order-dependent float sums (engine/order_dependence.py): an interval [lo, hi] per uncertain value, and whether a
# row surely passes every conservative selection below
LO_PREFIX = "__lo__"
HI_PREFIX = "__hi__"
CERTAIN = "__certain"
INTERVAL_TMP = "__iv"  # intermediate interval ends (dropped again)


def frag_col(index: int) -> str:
    """The fragment column of the ``index``-th partitioned scan."""
    return f"{FRAG_PREFIX}{index}"


def is_frag_col(name: str) -> bool:
    return name.startswith(FRAG_PREFIX) and name[len(FRAG_PREFIX):].isdigit()


def raw_col(frag_column: str) -> str:
    """The raw partition-value column standing for fragment column ``frag_column`` (``__f2`` -> ``__p2``)."""
    return RAW_PREFIX + frag_column[len(FRAG_PREFIX):]


def is_raw_col(name: str) -> bool:
    return name.startswith(RAW_PREFIX) and name[len(RAW_PREFIX):].isdigit()


def is_annotation(name: str) -> bool:
    """A fragment column or the fragment set."""
    return name == SET or is_frag_col(name)


def is_carried(name: str) -> bool:
    """A column every operator carries along unchanged next to the plan's columns: the multiplicity, the annotation,
    or a raw partition value still to become a fragment column."""
    return name == MULT or is_annotation(name) or is_raw_col(name)


def annotation_columns(columns: Iterable[str]) -> list[str]:
    return [c for c in columns if is_annotation(c)]


def nan_flag(name: str) -> str:
    """The Boolean column that says the float key ``name`` is NaN (state frames never join on a NaN)."""
    return f"{NAN_FLAG_PREFIX}{name}"


def lo_name(column: str) -> str:
    return f"{LO_PREFIX}{column}"


def hi_name(column: str) -> str:
    return f"{HI_PREFIX}{column}"


def is_interval_column(name: str) -> bool:
    return name.startswith((LO_PREFIX, HI_PREFIX, INTERVAL_TMP)) or name == CERTAIN


def join_columns(left: Sequence[str], right: Sequence[str], columns: Iterable[str]) -> list[str]:
    """A join's output columns: the left input's plan columns, the right's, ``__mult``, then the annotation (and raw
    partition value) columns in the order they appear in ``columns``. Interval columns do not cross a join."""
    carried = [c for c in columns if is_carried(c) and c != MULT]
    return [*left, *right, MULT, *carried]


__all__ = ["CERTAIN", "COUNT", "FRAG", "FRAG_PREFIX", "GROUP_ROWS", "HI_PREFIX", "INTERVAL_TMP", "LO_PREFIX", "MULT",
           "NAN_FLAG_PREFIX", "NO_GROUP", "RAW_PREFIX", "RIGHT_MULT", "RIGHT_SET", "ROW", "SET", "VALUE",
           "annotation_columns", "frag_col", "hi_name", "is_annotation", "is_carried", "is_frag_col",
           "is_interval_column", "is_raw_col", "join_columns", "lo_name", "nan_flag", "raw_col"]
