"""Planning range split and merge (``imp_core.sketch.repartition``, paper 7.4) and renaming fragment ids in operator
state (``annotation.relabel``): every value lands in a fragment the paper's rule allows, ids map monotonically, the
descriptive end bounds widen around cuts in the open first and last fragment."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from imp_core.engine.annotation import SET_DTYPE, relabel
from imp_core.engine.operators.merge import Merge
from imp_core.errors import StateError, UsageError
from imp_core.sketch import repartition as rp
from imp_core.sketch.partition import Partition, PartitionSet


def _values(rows: pl.Series, part: Partition) -> dict[int, pl.Series]:
    frag = part.fragment_of(rows)
    return {f: rows.filter(pl.Series(frag == f)) for f in range(part.fragments)}


def test_an_overflowing_range_is_split_and_underflowing_neighbours_merged() -> None:
    part = Partition("t", "a", tuple(range(0, 101, 10)), "int")
    data = pl.Series([x for x in range(100) for _ in range(0 if 10 <= x < 40 and x % 10 else 10)]
                     + [60 + k % 10 for k in range(1000)])
    rows = np.bincount(part.fragment_of(data), minlength=10).tolist()
    plan = rp.plan(part, rows, 3.0, _values(data, part))
    assert plan.merges == ((1, 3),) and list(plan.splits) == [4]  # mid id of old fragment 6
    assert plan.mid.fragments == 8 and plan.new.fragments == 8 + len(plan.splits[4])
    assert plan.old_to_mid().tolist() == [0, 1, 1, 1, 2, 3, 4, 5, 6, 7]
    assert plan.rule([2]) == [1] and plan.rule([6]) == list(range(4, 4 + len(plan.splits[4]) + 1))
    new_rows = np.bincount(plan.new.fragment_of(data), minlength=plan.new.fragments).tolist()
    assert max(new_rows) <= 2 * sum(rows) / len(rows) < max(rows)
    pieces = {4: new_rows[4:4 + len(plan.splits[4]) + 1]}
    assert plan.new_rows(rows, pieces) == new_rows


@pytest.mark.parametrize("seed", range(6))
def test_every_value_lands_where_the_rule_and_the_id_maps_say(seed: int) -> None:
    rng = np.random.default_rng(seed)
    inner = np.unique(rng.integers(-500, 500, 12))
    part = Partition("t", "a", (int(inner[0]) - 1, *map(int, inner[1:-1]), int(inner[-1]) + 1), "int")
    hot = int(rng.integers(-600, 600))
    data = pl.Series(np.concatenate([rng.integers(-700, 700, 400), hot + rng.integers(0, 40, 3000)]))
    rows = np.bincount(part.fragment_of(data), minlength=part.fragments).tolist()
    plan = rp.plan(part, rows, 2.0, _values(data, part))
    assert plan.changed
    old, new = part.fragment_of(data), plan.new.fragment_of(data)
    first = plan.mid_to_new()[plan.old_to_mid()[old]]
    assert (new >= first).all()
    for f in np.unique(old):  # a value's new fragment is one the rule gives its old fragment
        assert set(np.unique(new[old == f]).tolist()) <= set(plan.rule([int(f)]))
    assert np.all(np.diff(plan.old_to_mid()) >= 0) and np.all(np.diff(plan.mid_to_new()) > 0)


def test_cuts_in_the_open_end_fragments_widen_the_descriptive_bounds() -> None:
    part = Partition("t", "d", (dt.date(2024, 1, 1), dt.date(2024, 2, 1), dt.date(2024, 3, 1)), "date")
    late = pl.Series([dt.date(2024, 6, 1) + dt.timedelta(days=k % 90) for k in range(900)] + [dt.date(2024, 1, 5)] * 10)
    plan = rp.plan(part, [10, 900], 1.5, _values(late, part))
    assert plan.new.fragments > 2 and plan.new.bounds[-1] > plan.new.bounds[-2] > dt.date(2024, 3, 1)
    early = pl.Series([-1.0 - k for k in range(200)] + [float("nan"), None] + [500.0] * 5)
    fpart = Partition("t", "x", (100.0, 400.0, 600.0), "float")
    fplan = rp.plan(fpart, [201, 6], 1.5, _values(early, fpart))
    assert fplan.new.bounds[0] < fplan.new.bounds[1] < 0.0  # NULL stays in fragment 0, NaN in the last
    assert fplan.new.fragment_of(pl.Series([None, float("nan")])).tolist() == [0, fplan.new.fragments - 1]


def test_strings_and_repeated_values() -> None:
    part = Partition("t", "s", ("a", "m", "z"), "string")
    values = pl.Series(["b"] * 500 + ["c"] * 500 + ["n"])
    plan = rp.plan(part, [1000, 1], 1.5, _values(values, part))
    assert plan.new.bounds == ("a", "c", "m", "z")  # one cut: only two distinct values
    same = pl.Series(["b"] * 1000)
    assert rp.plan(part, [1000, 1], 1.5, _values(same, part)).new.bounds == part.bounds  # nothing to cut


def test_global_ids_of_later_tables_shift() -> None:
    a, b = Partition("a", "x", (0, 10, 20, 30), "int"), Partition("b", "y", (0, 5, 10), "int")
    mapping = rp.global_map(PartitionSet((a, b)), "a", np.array([0, 1, 1]), 2)
    assert mapping.tolist() == [0, 1, 1, 2, 3]
    assert rp.global_map(PartitionSet((b, a)), "a", np.array([0, 2, 3]), 4).tolist() == [0, 1, 2, 4, 5]


def test_bad_input() -> None:
    part = Partition("t", "a", (0, 10, 20), "int")
    with pytest.raises(UsageError, match="above 1"):
        rp.plan(part, [1, 1], 1.0, {})
    with pytest.raises(UsageError, match="2 fragments, got 3"):
        rp.plan(part, [1, 1, 1], 2.0, {})


def test_relabel_renames_fragment_columns_and_sets() -> None:
    df = pl.DataFrame({"k": [1, 2, 3], "__f0": pl.Series([0, 2, 3], dtype=pl.UInt32),
                       "__sk": pl.Series([[0, 3], [], None], dtype=SET_DTYPE)})
    out = relabel(df, np.array([0, 5, 6, 7]))
    assert out.get_column("__f0").to_list() == [0, 6, 7] and out.get_column("__sk").to_list() == [[0, 7], [], None]
    assert out.schema == df.schema
    with pytest.raises(StateError, match="two fragment ids in use"):
        relabel(df, np.array([0, 1, 3, 3]))
    merge = Merge("merge@r", 4)
    merge.counts = np.array([1, 0, 2, 3])
    _, frames = merge.relabeled_state(np.array([0, 1, 1, 2]), 3)
    assert frames["counts"].get_column("count").to_list() == [1, 2, 3]
