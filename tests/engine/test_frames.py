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
