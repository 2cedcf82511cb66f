"""``imp demo``: the IMP paper's running example end to end, then the same flow at scale.

Part 1 (Fig. 1, Examples 1.1 and 1.2): the ``sales`` table as a Delta table with Change Data Feed, the sketch of
Q_Top on ``price`` with the ranges ρ1..ρ4 is {ρ3, ρ4}; inserting s8 and maintaining incrementally gives {ρ2, ρ3, ρ4};
the query with and without the sketch returns (Apple, 5074) and (HP, 6194).

Part 2: a generated table of a few million rows clustered on the partition column; capture time versus incremental
maintenance time for a 1,000-row change, and files/rows read by the query with and without its sketch.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from rich.console import Console
from rich.table import Table

from imp_core.config import Settings
from imp_core.errors import NotFoundError
from imp_core.maintenance.service import SketchService
from imp_core.maintenance.strategy import Strategy

Q_TOP = ("SELECT brand, SUM(price * numSold) AS rev FROM sales GROUP BY brand "
         "HAVING SUM(price * numSold) > 5000")
SALES = pa.table({
    "sid": pa.array([1, 2, 3, 4, 5, 6, 7], pa.int64()),
    "brand": ["Lenovo", "Lenovo", "Apple", "Apple", "Dell", "HP", "HP"],
    "productName": ["ThinkPad T14s Gen 2", "ThinkPad T14s Gen 2", "MacBook Air 13-inch", "MacBook Pro 14-inch",
                    "Dell XPS 13 Laptop", "HP ProBook 450 G9", "HP ProBook 550 G9"],
    "price": pa.array([349, 449, 1199, 3875, 1345, 999, 899], pa.int64()),
    "numSold": pa.array([1, 2, 1, 1, 1, 4, 1], pa.int64()),
})
S8 = pa.table({"sid": pa.array([8], pa.int64()), "brand": ["HP"], "productName": ["HP ProBook 650 G10"],
               "price": pa.array([1299], pa.int64()), "numSold": pa.array([1], pa.int64())})
# ρ1 = [1, 600], ρ2 = [601, 1000], ρ3 = [1001, 1500], ρ4 = [1501, 10000] as half-open bounds
BOUNDS = "1,601,1001,1501,10001"


def same_rows(a: list[list], b: list[list]) -> bool:
    """Bag equality; doubles compare to 1e-9 relative (Spark sums doubles in plan-dependent order)."""
    if len(a) != len(b):
        return False
    for x, y in zip(sorted(map(tuple, a), key=repr), sorted(map(tuple, b), key=repr)):
        for u, v in zip(x, y):
            if isinstance(u, float) and isinstance(v, float):
                if not math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-12):
                    return False
            elif u != v:
                return False
    return True


def rho(fragments: list[int]) -> str:
    return "{" + ", ".join(f"ρ{f + 1}" for f in fragments) + "}"


def run_demo(settings: Settings, rows: int = 3_000_000, small_only: bool = False) -> int:
    console = Console()
    t_start = time.perf_counter()
    root = settings.warehouse_path / "demo"
    service = SketchService(settings, progress=lambda m: console.print(f"[dim]  … {m}[/dim]", highlight=False))

    console.rule("[bold]IMP demo, part 1: the paper's running example")
    sales = root / "sales"
    shutil.rmtree(sales, ignore_errors=True)
    sales.parent.mkdir(parents=True, exist_ok=True)
    write_deltalake(str(sales), SALES, mode="overwrite", configuration={"delta.enableChangeDataFeed": "true"})
    service.register_table("sales", str(sales), replace=True)
    _drop(service, "demo_top")
    console.print(f"sales (Fig. 1): 7 rows as a Delta table with Change Data Feed at {sales}")
    console.print(f"Q_Top: [cyan]{Q_TOP}[/cyan]")
    console.print("partition on price: ρ1=[1,600] ρ2=[601,1000] ρ3=[1001,1500] ρ4=[1501,10000]")
    service.create_sketch("demo_top", Q_TOP, ["sales.price"], bounds=[BOUNDS])
    first = service.describe("demo_top")
    frags = first["partitions"][0]["fragments"]
    console.print(f"[bold green]sketch v{first['version']} ({first['method']}): {rho(frags)}[/bold green]")

    console.print("insert s8 = (8, HP, HP ProBook 650 G10, 1299, 1)  (Example 1.2)")
    write_deltalake(str(sales), S8, mode="append")
    result = service.maintain("demo_top", strategy=Strategy.LAZY)
    second = service.describe("demo_top")
    frags2 = second["partitions"][0]["fragments"]
    console.print(f"[bold green]sketch v{second['version']} ({second['method']}, {result.delta_rows} change row): "
                  f"{rho(frags2)}[/bold green]")

    with_sketch = service.query(Q_TOP)
    without = service.query(Q_TOP, use_sketch=False)
    same = sorted(map(tuple, with_sketch.rows)) == sorted(map(tuple, without.rows))
    t = Table(title="Q_Top with and without the sketch")
    t.add_column("")
    t.add_column("result")
    t.add_column("rows read")
    t.add_row(f"with sketch v{with_sketch.sketch['version'] if with_sketch.sketch else '?'}",
              ", ".join(f"({b}, {r})" for b, r in sorted(map(tuple, with_sketch.rows))),
              f"{with_sketch.scanned.rows_read}/{with_sketch.scanned.rows_total}")
    t.add_row("without sketch", ", ".join(f"({b}, {r})" for b, r in sorted(map(tuple, without.rows))),
              f"{without.scanned.rows_read}/{without.scanned.rows_total}")
    console.print(t)
    console.print("[bold green]same result[/bold green]" if same else "[bold red]DIFFERENT RESULTS[/bold red]")
    ok = same and frags == [2, 3] and frags2 == [1, 2, 3]
    if small_only:
        return 0 if ok else 1

    console.rule(f"[bold]IMP demo, part 2: {rows:,} rows")
    ok = _scale(service, console, root, rows) and ok
    console.print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0 if ok else 1


def _drop(service: SketchService, name: str) -> None:
    try:
        service.drop_sketch(name)
    except NotFoundError:
        pass


def generate(rows: int, groups: int, seed: int = 7) -> pa.Table:
    """The paper's synthetic table shape: ``a`` uniform over the groups, other columns linear in ``a`` plus noise."""
    rng = np.random.default_rng(seed)
    a = np.sort(rng.integers(0, groups, rows))  # clustered on a: files hold narrow ranges of a
    cols: dict[str, np.ndarray] = {"id": np.arange(rows, dtype=np.int64), "a": a.astype(np.int64)}
    for i, name in enumerate("bcdef"):
        cols[name] = (a * (i + 1) * 0.5 + rng.normal(0, 50, rows)).round(2)
    return pa.table(cols)


def _scale(service: SketchService, console: Console, root: Path, rows: int) -> bool:
    groups = 5000
    path = root / f"groups_{rows}"
    if not (path / "_delta_log").exists():
        with console.status(f"generating {rows:,} rows ({groups} groups), clustered on a"):
            data = generate(rows, groups)
            write_deltalake(str(path), data, mode="overwrite", target_file_size=2 * 1024 * 1024,
                            configuration={"delta.enableChangeDataFeed": "true"})
    else:
        # a previous demo left changes behind: restore the generated version 0 data
        dt = DeltaTable(str(path))
        if dt.version() > 0:
            dt.restore(0)
    service.register_table("groups", str(path), replace=True)
    _drop(service, "demo_groups")
    sql = "SELECT a, AVG(b) AS ab FROM groups GROUP BY a HAVING AVG(c) < 150"
    console.print(f"query: [cyan]{sql}[/cyan]  (sketch on groups.a, 1,000 fragments)")

    t0 = time.perf_counter()
    service.create_sketch("demo_groups", sql, ["groups.a"], fragments=1000)
    capture_s = time.perf_counter() - t0
    info = service.describe("demo_groups")
    share = info["partitions"][0]["covered_share"]
    console.print(f"captured in {capture_s:.1f} s (bounds + capture); sketch covers {share:.1%} of the fragments")

    # a 1,000-row change: delete 500 rows (a contiguous id range, so Delta rewrites one file), insert 500 new ones
    dt = DeltaTable(str(path))
    first = rows // 3
    dt.delete(f"id >= {first} AND id < {first + 500}")
    new = generate(500, groups, seed=99)
    new = new.set_column(0, "id", pa.array(np.arange(rows, rows + 500, dtype=np.int64)))
    write_deltalake(str(path), new, mode="append")

    t0 = time.perf_counter()
    result = service.maintain("demo_groups", strategy=Strategy.LAZY)
    maintain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    service.maintain("demo_groups", strategy=Strategy.RECAPTURE)
    recapture_s = time.perf_counter() - t0

    with_sketch = service.query(sql)
    without = service.query(sql, use_sketch=False)
    with_sketch = service.query(sql)  # warm, measured
    without = service.query(sql, use_sketch=False)
    same = same_rows(with_sketch.rows, without.rows)

    t = Table(title=f"{rows:,} rows, 1,000 fragments, {result.delta_rows} change rows")
    t.add_column("step")
    t.add_column("time", justify="right")
    t.add_column("read", justify="right")
    t.add_row("full maintenance (recapture on Spark)", f"{recapture_s:.2f} s", f"{rows:,} rows")
    t.add_row("incremental maintenance (IMP)", f"{maintain_s:.2f} s", f"{result.delta_rows} change rows")
    t.add_row("query without sketch", f"{without.seconds:.2f} s",
              f"{without.scanned.files_read}/{without.scanned.files_total} files, "
              f"{without.scanned.rows_read:,} rows")
    t.add_row("query with sketch", f"{with_sketch.seconds:.2f} s",
              f"{with_sketch.scanned.files_read}/{with_sketch.scanned.files_total} files, "
              f"{with_sketch.scanned.rows_read:,} rows")
    console.print(t)
    console.print(f"incremental maintenance {recapture_s / max(maintain_s, 1e-9):.1f}x faster than full "
                  f"maintenance; the query with the sketch read "
                  f"{with_sketch.scanned.rows_read / max(without.scanned.rows_read, 1):.1%} of the rows; "
                  + ("[bold green]same result[/bold green]" if same else "[bold red]DIFFERENT RESULTS[/bold red]"))
    return same
