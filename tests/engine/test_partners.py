"""The keyed partner index against the first engine's frames: the same partners, counts and saved frames under
random batches of the other side's keys, the side's own changes and fetched partners (NULL keys, keys that leave
and come back, consolidation of appended and dropped rows)."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest

from imp_core.engine.annotation import consolidate
from imp_core.engine.keyed import KeyIndex, SortedMap
from imp_core.engine.operators.partners import N_KEY, FramePartners, KeyedPartners, Partners
from imp_core.engine.schema import MULT


def canon(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select(pl.col("k").alias("k0"))


def rows_frame(rows: list[tuple[int | None, int, int]]) -> pl.DataFrame:
    return pl.DataFrame({"k": [r[0] for r in rows], "v": [r[1] for r in rows], MULT: [r[2] for r in rows]},
                        schema={"k": pl.Int64, "v": pl.Int64, MULT: pl.Int64})


def net(frame: pl.DataFrame) -> list[tuple]:
    """The rows as a sorted multiset (their multiplicities added up, zeros gone)."""
    return sorted(consolidate(frame.select("k", "v", MULT)).rows())


def keys_frame(keys: list[int | None]) -> pl.DataFrame:
    return pl.DataFrame({"k0": keys}, schema={"k0": pl.Int64})


def both(rows: pl.DataFrame, counts: dict[int, int]) -> dict[str, Partners]:
    keys = pl.DataFrame({"k0": list(counts), N_KEY: list(counts.values())}, schema={"k0": pl.Int64, N_KEY: pl.Int64})
    return {"frames": FramePartners(rows, keys, None, canon, ["k"]), "keyed": KeyedPartners(rows, keys, None, canon)}


@pytest.mark.parametrize(("seed", "churn", "weak"), [(s, c, s % 3 == 0) for s in range(6) for c in (1024, 2)])
def test_keyed_and_frame_indexes_agree_batch_by_batch(seed: int, churn: int, weak: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KeyedPartners, "churn_min", churn)  # 2: consolidated every few batches
    monkeypatch.setattr(SortedMap, "pending_min", 4)  # the pending run is merged into the main run now and then
    if weak:  # hashes with 4 values: most keys collide (found through the collision buckets)
        hashes = KeyIndex.hashes
        monkeypatch.setattr(KeyIndex, "hashes", lambda self, frame: hashes(self, frame) & np.uint64(3))
    rng = random.Random(seed)
    side = [(rng.randint(0, 30), rng.randint(0, 5), 1) for _ in range(200)]  # the side's rows (key, value)
    counts = {k: rng.randint(1, 3) for k in range(0, 30, 2)}  # the other side's keys: the even ones
    indexes = both(rows_frame([r for r in side if r[0] in counts]), counts)
    keyed = indexes["keyed"]
    assert isinstance(keyed, KeyedPartners)
    for _ in range(60):
        what = rng.random()
        if what < 0.5:  # a delta of the other side: some keys gain rows, some lose them all
            keys = [rng.choice([None, *range(0, 34)]) for _ in range(rng.randint(1, 12))]
            before = dict(counts)
            mult = []
            for k in keys:  # a consistent change: a key's rows are deleted only while it has some
                m = rng.choice([-counts.get(k, 0), -1, 1, 2]) if k is not None and counts.get(k, 0) else 1
                mult.append(m)
                if k is not None:
                    counts[k] = counts.get(k, 0) + m
            new_keys = {k for k in counts if counts[k] > 0 and before.get(k, 0) == 0}
            mult = np.array(mult, dtype=np.int64)
            for index in indexes.values():
                index.count(keys_frame(keys), mult)
            # the join fetches the partners of keys that were not listed: every current side row with such a key
            fetched = rows_frame([r for r in side if r[0] in new_keys])
            for index in indexes.values():
                index.add_fetched(fetched)
        else:  # the side's own change: deletes of existing rows, inserts
            gone = rng.sample(range(len(side)), rng.randint(0, 4))
            delta = [(*side[i][:2], -1) for i in gone]
            side = [r for i, r in enumerate(side) if i not in gone]
            added = [(rng.choice([None, *range(0, 34)]), rng.randint(0, 5), 1) for _ in range(rng.randint(0, 4))]
            side += added
            for index in indexes.values():
                index.apply(rows_frame(delta + added))
        listed = sorted(k for k, n in counts.items() if n > 0)
        probe = keys_frame([None, *range(0, 36)])
        expect_listed = [k in listed for k in [None, *range(0, 36)]]
        want = sorted((r[0], r[1], 1) for r in side if r[0] in listed)
        for name, index in indexes.items():
            assert index.listed(probe).tolist() == expect_listed, name
            got = index.partners(keys_frame(listed))
            assert [r for r in net(got) if r[0] in listed] == net(rows_frame(want)), name
        # keyed: exactly the partners of the asked keys, nothing else
        some = listed[::2]
        assert {r[0] for r in keyed.partners(keys_frame(some)).rows()} <= set(some)
        assert net(keyed.partners(keys_frame(some))) == net(rows_frame([r for r in want if r[0] in some]))
    saved = {name: index.saved() for name, index in indexes.items()}
    assert net(saved["keyed"][0]) == net(saved["frames"][0])
    assert sorted(saved["keyed"][1].rows()) == sorted(saved["frames"][1].rows())
    assert saved["keyed"][1].get_column("k0").is_unique().all()
    # and the keyed index loads from what it saved
    again = KeyedPartners(*saved["keyed"], None, canon)
    assert net(again.partners(keys_frame(listed))) == net(rows_frame(want))


def test_a_key_that_leaves_takes_its_rows_and_comes_back_only_with_fetched_ones() -> None:
    index = KeyedPartners(rows_frame([(1, 10, 1), (1, 11, 1), (2, 20, 1)]),
                          pl.DataFrame({"k0": [1, 2], N_KEY: [1, 1]}), None, canon)
    index.count(keys_frame([1]), np.array([-1]))
    assert index.listed(keys_frame([1, 2])).tolist() == [False, True]
    assert index.partners(keys_frame([1])).height == 0
    index.apply(rows_frame([(1, 12, 1)]))  # a row of an unlisted key is not kept
    index.count(keys_frame([1]), np.array([1]))
    index.add_fetched(rows_frame([(1, 10, 1), (1, 11, 1), (1, 12, 1)]))
    assert net(index.partners(keys_frame([1]))) == [(1, 10, 1), (1, 11, 1), (1, 12, 1)]
    rows, keys = index.saved()
    assert net(rows) == [(1, 10, 1), (1, 11, 1), (1, 12, 1), (2, 20, 1)]
    assert sorted(keys.rows()) == [(1, 1), (2, 1)]



def test_two_column_text_keys_agree_with_the_frames() -> None:
    """Keys of a string and an integer column (``KeyIndex``'s hash path and key check; NULL keys never listed)."""
    rng = random.Random(5)
    universe = [(s, n) for s in ("a", "b", None) for n in range(4)]

    def canon2(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.select(pl.col("s").alias("k0"), pl.col("n").alias("k1"))

    def rows2(rows: list[tuple]) -> pl.DataFrame:
        return pl.DataFrame(rows, schema={"s": pl.String, "n": pl.Int64, "v": pl.Int64, MULT: pl.Int64},
                            orient="row")

    def keys2(keys: list[tuple]) -> pl.DataFrame:
        return pl.DataFrame(keys, schema={"k0": pl.String, "k1": pl.Int64}, orient="row")

    def net2(frame: pl.DataFrame) -> list[tuple]:
        return sorted(consolidate(frame.select("s", "n", "v", MULT)).rows())

    side = [(*rng.choice(universe), rng.randint(0, 3), 1) for _ in range(40)]
    counts = {k: 1 for k in universe[::2] if k[0] is not None}
    keys = pl.DataFrame([(*k, c) for k, c in counts.items()],
                        schema={"k0": pl.String, "k1": pl.Int64, N_KEY: pl.Int64}, orient="row")
    start = rows2([r for r in side if r[:2] in counts])
    indexes: dict[str, Partners] = {"frames": FramePartners(start, keys, None, canon2, ["s", "n"]),
                                    "keyed": KeyedPartners(start, keys, None, canon2)}
    for _ in range(30):
        batch = [rng.choice(universe) for _ in range(rng.randint(1, 5))]
        before, mult = dict(counts), []
        for k in batch:  # consistent: a key's rows are deleted only while it has some
            mult.append(-1 if k[0] is not None and counts.get(k, 0) else 1)
            if k[0] is not None:
                counts[k] = counts.get(k, 0) + mult[-1]
        fresh = {k for k, c in counts.items() if c > 0 and not before.get(k, 0)}
        for index in indexes.values():
            index.count(keys2(batch), np.array(mult, dtype=np.int64))
            index.add_fetched(rows2([r for r in side if r[:2] in fresh]))
        listed = [k for k, c in counts.items() if c > 0]
        want = net2(rows2([r for r in side if r[:2] in listed]))
        for name, index in indexes.items():
            assert index.listed(keys2(universe)).tolist() == [k in listed for k in universe], name
            assert [r for r in net2(index.partners(keys2(listed))) if r[:2] in listed] == want, name
    saved = {name: index.saved() for name, index in indexes.items()}
    assert net2(saved["keyed"][0]) == net2(saved["frames"][0])
    assert sorted(saved["keyed"][1].rows(), key=str) == sorted(saved["frames"][1].rows(), key=str)
