"""Benchmark data: the IMP paper's synthetic tables (Section 8) and TPC-H, as Delta tables with Change Data Feed.

Synthetic tables have 11 columns: key ``id``, ``a`` uniform over the group count, and ``b``..``j`` linear in ``a``
plus Gaussian noise (partially correlated, as in the paper). Rows are written sorted on ``a`` (the partition
column of most experiments), so Delta's per-file statistics are selective. Generated data lives under
``data/bench/`` (git-ignored, override with IMP_BENCH_DATA) and is reused between runs; each experiment copies the
base version it mutates (a shallow Delta clone: only the log is copied, data files are shared by path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("IMP_BENCH_DATA", ROOT / "data" / "bench"))
CDF = {"delta.enableChangeDataFeed": "true"}
COLUMNS = "bcdefghij"


def synthetic(rows: int, groups: int, seed: int = 7, first_id: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    a = np.sort(rng.integers(0, groups, rows)).astype(np.int64)
    cols: dict[str, np.ndarray] = {"id": np.arange(first_id, first_id + rows, dtype=np.int64), "a": a}
    for i, name in enumerate(COLUMNS):
        cols[name] = np.round(a * (1.0 + 0.25 * i) + rng.normal(0, max(groups / 100, 5), rows), 2)
    return pa.table(cols)


def write(path: Path, table: pa.Table, files: int = 0) -> Path:
    """Write a Delta table with CDF enabled; with ``files`` > 0, as that many data files (sorted row ranges)."""
    from deltalake import write_deltalake

    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if files <= 1:
        write_deltalake(str(tmp), table, mode="overwrite", configuration=CDF)
    else:
        step = -(-table.num_rows // files)
        for i in range(files):
            part = table.slice(i * step, step)
            if i == 0:
                write_deltalake(str(tmp), part, mode="overwrite", configuration=CDF)
            elif part.num_rows:
                write_deltalake(str(tmp), part, mode="append")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    from deltalake import DeltaTable

    _base_version_file(path).write_text(str(DeltaTable(str(path)).version()))
    return path


def _base_version_file(path: Path) -> Path:
    return path.with_name(path.name + ".base_version")


def base_table(name: str, rows: int, groups: int, files: int = 50) -> Path:
    """A cached synthetic table ``name`` (generated on first use)."""
    path = DATA / name
    marker = path / "_delta_log"
    if not marker.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        print(f"   generating {name}: {rows:,} rows, {groups:,} groups", flush=True)
        write(path, synthetic(rows, groups), files)
    return path


def join_helper(name: str, rows: int, groups: int, selectivity: float) -> Path:
    """A join partner table (``ttid``, ``x``) with ``rows`` unique keys of which ``selectivity`` x groups fall in
    ``[0, groups)``: that share of the big table's groups (and rows) find exactly one partner."""
    path = DATA / name
    if not (path / "_delta_log").exists():
        DATA.mkdir(parents=True, exist_ok=True)
        print(f"   generating {name}: {rows:,} rows, {selectivity:.0%} of {groups:,} keys joinable", flush=True)
        hits = max(1, int(groups * selectivity))
        keys = np.concatenate([np.arange(hits), np.arange(groups, groups + rows - hits)]).astype(np.int64)
        rng = np.random.default_rng(3)
        write(path, pa.table({"ttid": keys, "x": rng.integers(0, 100, rows).astype(np.int64)}), files=20)
    return path


def reset(path: Path) -> int:
    """Bring a cached table back to its generated contents (Delta RESTORE); returns the current version."""
    from deltalake import DeltaTable

    marker = _base_version_file(path)
    base = int(marker.read_text()) if marker.exists() else 0
    dt = DeltaTable(str(path))
    if dt.version() > base:
        current = {f.split("/")[-1] for f in dt.file_uris()}
        original = {f.split("/")[-1] for f in DeltaTable(str(path), version=base).file_uris()}
        if current != original:
            dt.restore(base)
            # the files the changes rewrote are garbage now: a delete rewrites whole files, so a long run would
            # otherwise keep tens of GB (the mixed workload filled a 100 GB disk); change-data files stay (small).
            # Only after a restore: a vacuum commits too, so vacuuming an unchanged table would move its version
            # under a second Setup of the same tables (TPC-H's two engines) and their versions would disagree
            DeltaTable(str(path)).vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    return DeltaTable(str(path)).version()


def change(path: Path, rows: int, seed: int, groups: int, next_id: int, delete_share: float = 0.5) -> int:
    """Commit a change of ``rows`` rows: random deletes of existing rows then inserts of new ones. Returns the new
    next id."""
    from deltalake import DeltaTable, write_deltalake

    rng = np.random.default_rng(seed)
    deletes = int(round(rows * delete_share))
    inserts = rows - deletes
    dt = DeltaTable(str(path))
    if deletes and deletes <= 20_000:
        victims = rng.choice(next_id, size=min(deletes * 3, next_id), replace=False)
        existing = dt.to_pyarrow_dataset().to_table(columns=["id"], filter=pc.field("id").isin(victims))
        chosen = existing.column("id").to_numpy()[:deletes]
        dt.delete(f"id IN ({', '.join(str(int(v)) for v in chosen)})")
    elif deletes:
        # large deletes: a random contiguous id range (a predicate with 100K literals would dominate the setup)
        start = int(rng.integers(0, max(1, next_id - deletes)))
        dt.delete(f"id >= {start} AND id < {start + deletes}")
    if inserts:
        new = synthetic(inserts, groups, seed=seed + 1, first_id=next_id)
        # inserts go to random groups, not sorted: like real new rows
        perm = rng.permutation(inserts)
        write_deltalake(str(path), new.take(perm), mode="append")
    return next_id + inserts


def max_id(path: Path) -> int:
    """Largest ``id`` in the table, from Delta statistics."""
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    return int(pc.max(actions.column("max.id")).as_py() or 0)


def tpch(scale: float = 1.0) -> Path:
    """TPC-H tables at ``scale`` as Delta tables with CDF (generated with tpchgen-cli)."""
    root = DATA / f"tpch_sf{scale:g}"
    if (root / "lineitem" / "_delta_log").exists():
        return root
    raw = DATA / f"tpch_sf{scale:g}_parquet"
    if not raw.exists():
        raw.mkdir(parents=True)
        exe = Path(sys.executable).parent / "tpchgen-cli"
        print(f"   generating TPC-H SF{scale:g} with tpchgen-cli", flush=True)
        subprocess.run([str(exe), "parquet", "-s", str(scale), "--output-dir", str(raw)], check=True)
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    for f in sorted(raw.glob("*.parquet")):  # streamed: SF10's lineitem does not fit in memory as Arrow
        source = pq.ParquetFile(f)
        schema = pa.schema([pa.field(x.name, _tpch_type(x.type), True) for x in source.schema_arrow])
        path = root / f.stem
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for i, batch in enumerate(source.iter_batches(batch_size=500_000)):
            part = pa.Table.from_batches([batch]).cast(schema)
            write_deltalake(
                str(tmp), part, mode="overwrite" if i == 0 else "append", configuration=CDF if i == 0 else None
            )
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        _base_version_file(path).write_text(str(DeltaTable(str(path)).version()))
    return root


def _tpch_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view():
        return pa.string()
    if pa.types.is_integer(t):
        return pa.int64()
    return t
