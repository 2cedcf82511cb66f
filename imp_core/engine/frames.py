"""Frame steps on small deltas without a polars query run.

A polars ``DataFrame.select``/``with_columns``/``filter`` is a lazy query collected on the spot: it costs a fixed
0.1-0.6 ms on a frame of a few rows (planning, the thread pool), while putting Series that already exist into a frame
costs microseconds. These helpers do the column bookkeeping of the operators' small-batch paths that way; expressions
still go through polars. See docs/ARCHITECTURE.md, "Cost of a batch".
"""

from __future__ import annotations

import numpy as np
import polars as pl

try:  # polars' own constructors, the steps ``pl.Series``/``pl.DataFrame`` end in after input handling of ~5-20 us
    from polars.datatypes.constructor import numpy_type_to_constructor
except ImportError:  # pragma: no cover - another polars layout: pl.Series does it all
    numpy_type_to_constructor = None  # type: ignore[assignment]
try:
    from polars._plr import PyDataFrame
except ImportError:  # pragma: no cover - polars 1.x
    try:
        from polars.polars import PyDataFrame  # type: ignore[no-redef]
    except ImportError:
        PyDataFrame = None  # type: ignore[assignment,misc]

_PLAIN = {np.dtype(t): d for t, d in [
    (np.int8, pl.Int8), (np.int16, pl.Int16), (np.int32, pl.Int32), (np.int64, pl.Int64), (np.uint8, pl.UInt8),
    (np.uint16, pl.UInt16), (np.uint32, pl.UInt32), (np.uint64, pl.UInt64), (np.float32, pl.Float32),
    (np.float64, pl.Float64), (np.bool_, pl.Boolean)]}


def frame(columns: list[pl.Series]) -> pl.DataFrame:
    """``pl.DataFrame(columns)`` for Series of one height and distinct names (polars checks both and raises
    otherwise): ~3 us where ``pl.DataFrame`` takes ~20 us."""
    if PyDataFrame is None or not columns:
        return pl.DataFrame(columns)
    return pl.DataFrame._from_pydf(PyDataFrame([c._s for c in columns]))  # noqa: SLF001 - polars' own constructor


_frame = frame  # for the helpers whose argument is named ``frame``


def series(name: str, values: np.ndarray, dtype: pl.DataType | None = None) -> pl.Series:
    """``pl.Series(name, values, dtype=dtype)`` for a NumPy array. A contiguous 1-D array of a plain numeric or
    boolean type already of ``dtype`` goes straight to polars' constructor for its type (a batch builds ~50 Series;
    the checks ``pl.Series`` makes first cost more than the Series). As with ``pl.Series``, the Series may share
    the array's memory: do not write to the array afterwards."""
    plain = _PLAIN.get(values.dtype)
    if plain is None or numpy_type_to_constructor is None or values.ndim != 1 or \
            not values.flags.c_contiguous or not values.flags.aligned or dtype is not None and dtype != plain:
        return pl.Series(name, values, dtype=dtype)
    make = numpy_type_to_constructor(values, values.dtype.type)
    return pl.Series._from_pyseries(make(name, values, plain not in (pl.Float32, pl.Float64)))  # noqa: SLF001 - polars' own constructor


def with_series(frame: pl.DataFrame, *series: pl.Series) -> pl.DataFrame:
    """``frame.with_columns(series)`` for Series of the frame's height: a Series replaces the column of its name in
    place, the others are appended in order."""
    new = {s.name: s for s in series}
    kept = [new.pop(c.name, c) for c in frame.get_columns()]
    return _frame([*kept, *new.values()])


def columns(frame: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """``frame.select(names)`` for plain column names."""
    return _frame([frame.get_column(n) for n in names])


def drop(frame: pl.DataFrame, *names: str) -> pl.DataFrame:
    """``frame.drop(names)`` for plain column names."""
    return _frame([c for c in frame.get_columns() if c.name not in names])


def cast(frame: pl.DataFrame, types: dict[str, pl.DataType], names: list[str]) -> pl.DataFrame:
    """``frame`` with the ``names`` columns cast to ``types`` (no polars step when they already match)."""
    casts = {n: types[n] for n in names if frame.get_column(n).dtype != types[n]}
    return frame.cast(casts) if casts else frame  # type: ignore[arg-type]


def rows(frame: pl.DataFrame, mask: np.ndarray) -> pl.DataFrame:
    """``frame.filter(mask)`` for a NumPy boolean mask (the frame itself when every row is kept)."""
    if mask.all():
        return frame
    keep = series("", mask)  # a Series filter per column: ~7 us each, where a frame gather by index is ~100 us
    return _frame([c.filter(keep) for c in frame.get_columns()])


class Exprs:
    """Expressions to evaluate on a frame. When every one is a plain column reference (renamed or not), they are
    taken as the frame's Series without a polars run; otherwise polars evaluates them."""

    def __init__(self, exprs: list[pl.Expr]) -> None:
        self.exprs = list(exprs)
        self.renames = _renames(self.exprs)

    def series(self, frame: pl.DataFrame) -> list[pl.Series] | None:
        """The expressions' values as the frame's Series (renamed); None unless every one is a plain column."""
        if self.renames is None:
            return None
        return [frame.get_column(src).alias(out) for src, out in self.renames]

    def select(self, frame: pl.DataFrame) -> pl.DataFrame:
        got = self.series(frame)
        return frame.select(self.exprs) if got is None else _frame(got)

    def with_columns(self, frame: pl.DataFrame) -> pl.DataFrame:
        got = self.series(frame)
        return frame.with_columns(self.exprs) if got is None else with_series(frame, *got)


def _renames(exprs: list[pl.Expr]) -> list[tuple[str, str]] | None:
    """(source, output) name per expression when each is a plain column reference, else None."""
    out = []
    for e in exprs:
        base = e.meta.undo_aliases()
        if not base.meta.is_column():
            return None
        out.append((base.meta.output_name(), e.meta.output_name()))
    return out


__all__ = ["Exprs", "cast", "columns", "drop", "frame", "rows", "series", "with_series"]
