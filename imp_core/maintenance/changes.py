"""Reading one table's change rows for a maintenance pass: only the columns the query uses, and, with selection
push-down on, only the rows that can pass the selections right above the table's scans."""

from __future__ import annotations

import polars as pl

from imp_core.config import Optimizations
from imp_core.engine.evaluate import compile_expr
from imp_core.maintenance.feeds import ChangeFeeds
from imp_core.plan.nodes import Plan
from imp_core.plan.pushdown import change_filter, to_datafusion
from imp_core.sources.delta import DeltaSource


def used_columns(plan: Plan, table: str) -> list[str]:
    cols: list[str] = []
    for scan in plan.scans():
        if scan.table == table:
            cols += [c.name for c in scan.columns if c.name not in cols]
    return cols


def read_changes(
    source: DeltaSource,
    plan: Plan,
    after: int,
    upto: int,
    opts: Optimizations | None = None,
    feeds: ChangeFeeds | None = None,
) -> pl.DataFrame:
    """Change rows of ``(after, upto]`` (plain column names, ``__mult``, ``__version``), through ``feeds`` when a
    grouped job shares its tables' change feeds."""
    opts = opts or Optimizations()
    pred = change_filter(plan, source.name) if opts.selection_pushdown else None
    hint = to_datafusion(pred) if pred is not None else None
    columns = used_columns(plan, source.name)
    if feeds is not None:
        raw = feeds.changes(source, after, upto, columns, predicate=hint)
    else:
        raw = source.changes(after, upto, columns, predicate=hint)
    changes = pl.from_arrow(raw)
    assert isinstance(changes, pl.DataFrame)
    if pred is not None and changes.height:
        # exact filter in the engine's semantics (the DataFusion predicate, when there is one, is a pre-filter)
        changes = changes.filter(compile_expr(pred).fill_null(False))
    return changes
