"""The frame steps without a polars run (``imp_core.engine.frames``) give what the polars steps they replace give."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from imp_core.engine import frames

FRAME = pl.DataFrame({"a": [1, 2, None, 4], "b": [0.5, None, 2.5, 3.5], "s": ["x", "y", "z", None]})


def test_with_series_replaces_in_place_and_appends_like_with_columns() -> None:
    new_b = pl.Series("b", [9.0, 8.0, 7.0, 6.0])
    extra = pl.Series("c", [True, False, None, True])
    assert_frame_equal(frames.with_series(FRAME, extra, new_b), FRAME.with_columns(extra, new_b))
    assert frames.with_series(FRAME, extra, new_b).columns == ["a", "b", "s", "c"]


def test_columns_and_rows_match_select_and_filter() -> None:
    assert_frame_equal(frames.columns(FRAME, ["s", "a"]), FRAME.select(["s", "a"]))
    for mask in ([True, False, True, False], [True] * 4, [False] * 4):
        assert_frame_equal(frames.rows(FRAME, np.array(mask)), FRAME.filter(pl.Series(mask)))
    assert frames.rows(FRAME, np.ones(4, dtype=bool)) is FRAME


def test_cast_only_the_columns_that_differ() -> None:
    types: dict[str, pl.DataType] = {"a": pl.Int32(), "b": pl.Float64()}
    assert frames.cast(FRAME, {"b": pl.Float64()}, ["b"]) is FRAME
    assert frames.cast(FRAME, types, ["a", "b"]).schema == pl.Schema({"a": pl.Int32, "b": pl.Float64, "s": pl.String})


@pytest.mark.parametrize("exprs,plain", [
    ([pl.col("a").alias("k"), pl.col("b")], True),
    ([pl.col("a").alias("k"), (pl.col("b") * 2).alias("b2")], False),
    ([pl.col("a").cast(pl.Float64).alias("a")], False),
    ([pl.lit(1).alias("one")], False),
])
def test_exprs_take_plain_columns_as_series_and_evaluate_the_rest(exprs: list[pl.Expr], plain: bool) -> None:
    e = frames.Exprs(exprs)
    assert (e.renames is not None) == plain
    assert_frame_equal(e.select(FRAME), FRAME.select(exprs))
    assert_frame_equal(e.with_columns(FRAME), FRAME.with_columns(exprs))


def test_exprs_read_every_source_before_renaming() -> None:
    """A swap of two columns reads both from the input, as polars' with_columns does."""
    swap = [pl.col("a").alias("b"), pl.col("b").alias("a")]
    frame = FRAME.select(["a", "b"]).with_columns(pl.col("b").cast(pl.Int64, strict=False))
    assert_frame_equal(frames.Exprs(swap).with_columns(frame), frame.with_columns(swap))


@pytest.mark.parametrize("np_type", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                     np.uint64, np.float32, np.float64, np.bool_])
@pytest.mark.parametrize("dtype", [None, pl.Int64, pl.UInt32, pl.Float64])
def test_series_equals_pl_series(np_type: type, dtype: pl.DataType | None) -> None:
    """Plain arrays take polars' constructor for their type directly; everything else (a cast, a strided view,
    a NaN) gives what ``pl.Series`` gives."""
    values = (np.arange(-3, 9) % 5).astype(np_type)
    if np.dtype(np_type).kind == "f" and dtype in (None, pl.Float64):
        values[2], values[3] = np.nan, -0.0
    for array in (values, values[::2]):
        got, want = frames.series("v", array, dtype), pl.Series("v", array, dtype=dtype)
        assert got.name == "v" and got.dtype == want.dtype
        assert got.equals(want, check_names=True), (np_type, dtype)
        assert got.null_count() == 0  # NaN stays NaN, as in pl.Series
    assert frames.series("e", np.empty(0, dtype=np_type)).len() == 0


def test_frame_equals_pl_dataframe_and_refuses_what_it_refuses() -> None:
    assert frames.PyDataFrame is not None and frames.numpy_type_to_constructor is not None  # the pinned polars'
    cols = FRAME.get_columns()
    assert_frame_equal(frames.frame(cols), pl.DataFrame(cols))
    assert frames.frame([]).shape == (0, 0)
    with pytest.raises(pl.exceptions.ShapeError):
        frames.frame([cols[0], cols[1].head(2)])
    with pytest.raises(pl.exceptions.DuplicateError):
        frames.frame([cols[0], cols[1].alias("a")])
