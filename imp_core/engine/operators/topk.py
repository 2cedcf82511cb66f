"""Top-k (paper 5.2.7): the first ``k`` rows in an order, with bag semantics and ties as in the paper's Fig. 4.

``τ_{k,O}(R) = {t^m | pos(t) < k, m = min(R(t), k − pos(t))}`` where ``pos(t)`` is the multiplicity of rows strictly
before ``t``, so rows tied on the order keys share one position (every tied row is kept). Copies of a tuple ``t``
from different fragments are one output row annotated with the union of their fragments. State: every input row with
its annotation and multiplicity (the paper's ordered map), optionally a bounded buffer (paper 7.2); an order-dependent
ORDER BY key makes the ranking conservative (``imp_core.engine.order_dependence``). See docs/ARCHITECTURE.md,
"Operators", "Cost of a batch" and "Optimizations".

Indexed state (the default for the exact, unbuffered ranking): the state is split at a *boundary* order key into a
small **head**, the complete tie groups ranked first (at least ``k`` and about ``k + HEAD_MARGIN`` rows), and the
**rest**, every later row: a compacted **base** (one row per tuple, unsorted), kept as a
:class:`~imp_core.engine.state.Chunk` so a saved version references it instead of writing it again, and a **log** of
signed changes since (tombstones are negative rows), folded into a new base when it outgrows a fraction of the base.
The top-k and its fragments depend on the head only (every row before a head row is in the head), so a batch costs
its own size plus the head's: changes ranked after the boundary are appended to the log and produce no output, and a
loaded base is not even read until a refill or a compaction needs it. The head is refilled from the rest (one full
sort) when deletions leave it fewer than ``k`` rows, and trimmed back when inserts double it. With ``index=False`` the
operator keeps every row in one frame and re-sorts it per batch (the first engine's state, kept for side-by-side
benchmarks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE, as_sets
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.operators.base import OutputStateOperator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.order_dependence import IntervalCompiler
from imp_core.engine.schema import CERTAIN, COUNT, MULT, SET, hi_name, lo_name
from imp_core.engine.state import Chunk, Frame
from imp_core.errors import BufferExhaustedError, StateError
from imp_core.plan.nodes import Plan, SortKey, TopK

N = COUNT
SKEY = "__skey"
# version of the state's frames: 3 = indexed (head ``rows`` + ``rest`` base + ``rest_log`` + ``boundary``);
# 2 = indexed with the rest as one log (read); 1 (no key) = all rows
LAYOUT = 3
HEAD_MARGIN = 512  # rows the head keeps beyond k, so deletions rarely force a refill from the rest
COMPACT_FRACTION = 0.25  # the rest log is folded into the base when it has more rows than this share of the base
COMPACT_MIN = 4096


class TopKOp(OutputStateOperator):
    """The state frame ``rows`` holds input rows with their annotation ``__sk``, the annotation as text ``__skey``
    (a grouping key) and their multiplicity ``__n``: every row (``index=False``), the buffer's, or the head of the
    indexed state, whose later rows are in ``rest`` (the base, positive) and ``rest_log`` (signed), same columns, and
    ``boundary`` the head's worst order key.
    With a cut buffer, ``boundary`` is the worst order key kept: changes ranked after it are dropped; deletions that
    leave fewer than ``k`` rows raise ``BufferExhaustedError`` (the service recaptures)."""

    kind = "topk"

    def __init__(self, op_id: str, order: tuple[SortKey, ...], k: int, schema: dict[str, pl.DataType],
                 fingerprint: str = "", buffer: int = 0, bounded: frozenset[str] | set[str] = frozenset(),
                 conservative: bool = False, index: bool = True, head_margin: int = HEAD_MARGIN) -> None:
        """``schema`` includes any interval and ``__certain`` columns the input carries; ``bounded`` names the
        columns with intervals; ``conservative`` switches to the conservative ranking (and off the buffer);
        ``index`` keeps the indexed head/rest state (used only for the exact ranking without a buffer) with a head
        of about ``k + head_margin`` rows."""
        super().__init__(op_id)
        self.order = order
        self.k = k
        self.schema = dict(schema)
        self.fingerprint = fingerprint
        self.conservative = conservative
        self.buffer = max(buffer, k) if buffer and not conservative else 0
        self.indexed = index and not self.buffer and not conservative
        self.head_target = k + head_margin
        self.compact_min = COMPACT_MIN
        self._order_exprs = [compile_expr(s.expr).alias(f"__o{i}") for i, s in enumerate(order)]
        if conservative:
            self._ic = IntervalCompiler(bounded)
            unc = [i for i, s in enumerate(order) if s.expr.columns() & set(bounded)]
            self._first_uncertain = unc[0] if unc else len(order)
            if unc:
                iv = self._ic.interval(order[self._first_uncertain].expr)
                self._interval_exprs = [iv.lo.alias("__klo"), iv.hi.alias("__khi")]
        self.reset()

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> TopKOp:
        assert isinstance(node, TopK)
        role = ctx.role(node)
        bounded = ctx.bounded_input(node)
        schema = {f.name: polars_type(f.dtype) for f in node.schema}
        for c in sorted(bounded):  # intervals and the certain flag the input carries stay with each row
            schema[lo_name(c)] = schema[hi_name(c)] = pl.Float64()
        if role.flagged_input:
            schema[CERTAIN] = pl.Boolean()
        return cls(ctx.op_id(cls.kind), node.order, node.k, schema, ctx.fingerprint, buffer=ctx.topk_buffer,
                   bounded=bounded, conservative=role.conservative, index=ctx.topk_index)

    def reset(self) -> None:
        self.rows = pl.DataFrame(schema={**self.schema, SET: SET_DTYPE, SKEY: pl.String, N: pl.Int64})
        self.truncated = False  # True when the buffer dropped rows of the input
        # the worst kept order key (one row of __o{i}): of a cut buffer when truncated; of the head when indexed
        self.boundary: pl.DataFrame | None = None
        # indexed: the rows after the boundary, as a compacted base (None: empty) and a log of signed changes since
        self.base: Chunk | None = None
        self.base_rows = 0  # rows of the base, known without loading it
        self.log = self.rows.clear()
        self._top: pl.DataFrame | None = None  # indexed: the current top-k (the next batch's "before")

    @property
    def data_cols(self) -> list[str]:
        return list(self.schema)

    def state_frames(self) -> tuple[dict[str, Any], dict[str, Frame]]:
        """Frames ``rows`` (indexed: the head), ``rest`` (indexed: the base, a chunk, when not empty), ``rest_log``
        (indexed, when not empty) and ``boundary`` (a cut buffer's, or the head's when the rest is not empty). The
        base goes out as the chunk it is: a version that did not compact references the stored copy, and nothing
        sorts or encodes the rows of a large input per save."""
        frames: dict[str, Frame] = {"rows": self.rows}
        meta: dict[str, Any] = {"k": self.k, "buffer": self.buffer, "truncated": self.truncated}
        if self.indexed:
            meta["layout"] = LAYOUT
            if self.base is not None:
                frames["rest"] = self.base
                meta["rest_rows"] = self.base_rows
            if self.log.height:
                frames["rest_log"] = self.log
        if self.boundary is not None:
            frames["boundary"] = self.boundary
        return meta, frames

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, Frame]) -> None:
        """Take over saved state; a state of another layout (the first engine's single frame, an indexed state with
        its rest as one log, or an indexed state loaded with the index switched off) is converted. A cut buffer's
        state loads only into a buffered operator; a saved base is checked when it is first read."""
        if int(meta.get("k", -1)) != self.k or "rows" not in frames:
            raise StateError(f"operator {self.op_id}: saved top-k state is for a different query; recapture")
        layout = meta.get("layout", 1)
        if layout not in (1, 2, LAYOUT):
            raise StateError(f"operator {self.op_id}: saved top-k state has layout {layout}, this imp reads 1 to "
                             f"{LAYOUT}; recapture the sketch")
        self.truncated = bool(meta.get("truncated", False))
        if self.truncated and (self.indexed or layout != 1):
            raise StateError(f"operator {self.op_id}: saved top-k state is a cut buffer, the operator keeps every "
                             f"row now; recapture the sketch")
        base, log = self._rest_frames(frames)
        rows: pl.DataFrame = frames["rows"]  # type: ignore[assignment]
        self._top = None
        if self.indexed and layout != 1:
            self.rows = rows
            self.boundary = frames.get("boundary")  # type: ignore[assignment]
            self.base, self.log = base, log if log is not None else self.rows.clear()
            self.base_rows = self._saved_base_rows(meta, base) if layout == LAYOUT or base is None else \
                base.frame().height  # layout 2: the rest is one inline log, taken as the base
            if (self.base is not None or self.log.height) and self.boundary is None:
                raise StateError(f"operator {self.op_id}: an indexed top-k state without its boundary; recapture")
            return
        parts = [rows, *([base.frame()] if base is not None else []), *([log] if log is not None else [])]
        self.rows = parts[0] if len(parts) == 1 else self._compacted(pl.concat(parts))
        self.base, self.base_rows, self.log = None, 0, self.rows.clear()
        self.boundary = frames.get("boundary") if self.truncated else None  # type: ignore[assignment]
        if self.truncated and self.boundary is None:
            raise StateError(f"operator {self.op_id}: a cut top-k buffer without its boundary; recapture")
        if self.indexed:
            self._rebuild()

    def _rest_frames(self, frames: dict[str, Frame]) -> tuple[Chunk | None, pl.DataFrame | None]:
        """The saved base (a chunk, its shape checked when read) and log, in this operator's columns and types."""
        def shaped(df: pl.DataFrame, name: str) -> pl.DataFrame:
            try:
                return df.select(self.rows.columns).cast(self.rows.schema, strict=True)
            except (pl.exceptions.PolarsError, TypeError, ValueError) as e:
                raise StateError(f"operator {self.op_id}: saved top-k frame {name!r} has the wrong shape; "
                                 f"recapture the sketch") from e
        rest, log = frames.get("rest"), frames.get("rest_log")
        base = None if rest is None else (rest if isinstance(rest, Chunk) else Chunk.of(rest))
        if base is not None:
            base = base.checked(lambda df: shaped(df, "rest"))
        if isinstance(log, Chunk):
            log = log.frame()
        return base, None if log is None else shaped(log, "rest_log")

    def _saved_base_rows(self, meta: dict[str, Any], base: Chunk | None) -> int:
        if base is None:
            return 0
        rows = meta.get("rest_rows")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise StateError(f"operator {self.op_id}: saved top-k state lacks the size of its rest; recapture")
        return rows

    def relabeled_state(self, mapping: np.ndarray, total: int) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        """Renamed fragment ids change the set keys that order ties: the state goes out in the single-frame layout,
        so the operator taking it re-sorts its head (``set_state_frames``)."""
        meta, frames = super().relabeled_state(mapping, total)
        skey = pl.col(SET).cast(pl.List(pl.String)).list.join(",").alias(SKEY)
        frames = {n: df.with_columns(skey) if SKEY in df.columns else df for n, df in frames.items()}
        if meta.get("layout") in (2, LAYOUT):
            meta = {**meta, "layout": 1}
        return meta, frames

    @property
    def rest_rows(self) -> int:
        """Rows after the boundary: the base's and the log's (not summed per tuple)."""
        return self.base_rows + self.log.height

    def rest(self) -> pl.DataFrame:
        """The rest as one frame: the base (read from the catalog if not yet) and the log, not summed."""
        if self.base is None:
            return self.log
        return pl.concat([self.base.frame(), self.log], rechunk=False) if self.log.height else self.base.frame()

    def all_rows(self) -> pl.DataFrame:
        """Every kept row (indexed: head and compacted rest together)."""
        if not self.indexed or self.rest_rows == 0:
            return self.rows
        return self._compacted(pl.concat([self.rows, self.rest()]))

    def canonical(self) -> dict[str, pl.DataFrame]:
        rows = self.all_rows()
        cols = [c for c in rows.columns if c != SET]
        return {"rows": rows.sort(cols, nulls_last=True) if rows.height else rows}

    # -- the top-k of a multiset -----------------------------------------------------------------------------------

    def _sorted(self, rows: pl.DataFrame) -> pl.DataFrame:
        r = rows.with_columns(self._order_exprs)
        by = [f"__o{i}" for i in range(len(self.order))]
        return r.sort(by=by + [SKEY], descending=[s.descending for s in self.order] + [False],
                      nulls_last=[not s.effective_nulls_first for s in self.order] + [False], maintain_order=True)

    def top(self, rows: pl.DataFrame | None = None) -> pl.DataFrame:
        """The current top-k rows with their output multiplicity in ``__mult``."""
        rows = self.rows if rows is None else rows
        if rows.height == 0 or self.k == 0:
            return rows.head(0).select([*self.data_cols, SET, SKEY]).with_columns(pl.lit(0, pl.Int64).alias(MULT))
        if self.conservative:
            return self._conservative_top(rows)
        s, groups = self._tie_groups(self._sorted(rows))
        s = s.join(groups.select("__grp", "__pos"), on="__grp", how="left").filter(pl.col("__pos") < self.k)
        return self._one_row_per_tuple(s, pl.col("__pos").first())

    def _tie_groups(self, s: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """A sorted frame with each row's tie group ``__grp``, and per group its rows ``__gn`` and position
        ``__pos`` (the rows strictly before it)."""
        s = s.with_columns(group_number([f"__o{i}" for i in range(len(self.order))]).alias("__grp"))
        groups = s.group_by("__grp", maintain_order=True).agg(pl.col(N).sum().alias("__gn"))
        return s, groups.with_columns((pl.col("__gn").cum_sum() - pl.col("__gn")).alias("__pos"))

    def _one_row_per_tuple(self, s: pl.DataFrame, position: pl.Expr) -> pl.DataFrame:
        """The kept rows ``s`` as output rows: one per tuple t, with ``min(R(t), k − pos)`` copies (``R(t)`` over all
        its annotations) and the union of those annotations."""
        s = (s.group_by(self.data_cols, maintain_order=True)
             .agg(pl.col(N).sum(), pl.col(SET).list.explode(keep_nulls=False, empty_as_null=False)
                  .unique().sort().cast(FRAG_DTYPE), position))
        s = s.with_columns(pl.min_horizontal(pl.col(N), pl.lit(self.k) - pl.col("__pos")).alias(MULT),
                           pl.col(SET).cast(pl.List(pl.String)).list.join(",").alias(SKEY))
        return s.select([*self.data_cols, SET, SKEY, MULT])

    def _conservative_top(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Rows with fewer than ``k`` rows surely before them, with ``min(R(t), k − pos)`` copies, ``pos`` counting
        only the surely earlier rows: rows that surely exist (``__certain``) and whose key interval lies entirely
        before the row's (keys before the first uncertain one compared exactly, keys after it ignored). That keeps
        every row some summation order could rank within ``k``; values are unchanged, only membership grows."""
        j = self._first_uncertain
        prefix = [f"__o{i}" for i in range(j)]
        r = rows.with_columns(self._order_exprs[:j])
        if j < len(self.order):
            r = self._ic.apply(r).with_columns(self._interval_exprs)
        # exact prefix keys: one dense group number per distinct prefix, in order
        if prefix:
            s = r.select(prefix).with_row_index("__i").sort(
                by=prefix, descending=[x.descending for x in self.order[:j]],
                nulls_last=[not x.effective_nulls_first for x in self.order[:j]], maintain_order=True)
            s = s.with_columns((group_number(prefix) - 1).alias("__pr"))
            group = np.empty(r.height, dtype=np.int64)
            group[s.get_column("__i").to_numpy()] = s.get_column("__pr").to_numpy()
        else:
            group = np.zeros(r.height, dtype=np.int64)
        # the uncertain key: ranks of both ends in the key's order; a row is surely before another when its latest
        # end comes before the other's earliest
        if j < len(self.order):
            key = self.order[j]
            ends = pl.concat([r.get_column("__klo"), r.get_column("__khi")])
            rank = ends.rank("dense", descending=key.descending).cast(pl.Int64)
            top = int(rank.max() or 0) + 1  # type: ignore[arg-type]
            ranks = rank.fill_null(0 if key.effective_nulls_first else top).to_numpy()
            lo_rank, hi_rank = ranks[:r.height], ranks[r.height:]
            earliest, latest = (hi_rank, lo_rank) if key.descending else (lo_rank, hi_rank)
            width = top + 2
        else:
            earliest = latest = np.zeros(r.height, dtype=np.int64)
            width = 1
        as_earlier = group * width + latest  # where a row stands as a possibly earlier row
        as_later = group * width + earliest  # what a surely earlier row must stand before
        weight = r.get_column(N).to_numpy().astype(np.int64)
        if CERTAIN in r.columns:
            weight = np.where(r.get_column(CERTAIN).fill_null(False).to_numpy(), weight, 0)
        order = np.argsort(as_earlier, kind="stable")
        cum = np.concatenate([[0], np.cumsum(weight[order])])
        pos = cum[np.searchsorted(as_earlier[order], as_later, side="left")]
        s = rows.with_columns(pl.Series("__pos", pos, dtype=pl.Int64)).filter(pl.col("__pos") < self.k)
        return self._one_row_per_tuple(s, pl.col("__pos").min())

    # -- incremental maintenance -----------------------------------------------------------------------------------

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        if delta.height == 0:
            return self.empty_delta()
        d = as_sets(delta)
        d = d.with_columns(pl.col(SET).cast(pl.List(pl.String)).list.join(",").alias(SKEY))
        d = d.group_by([*self.data_cols, SKEY]).agg(pl.col(MULT).sum().alias("__dn"), pl.col(SET).first())
        if self.indexed:
            return self._process_indexed(d)
        if self.truncated:
            d = self._within_boundary(d)
            if d.height == 0:
                return self.empty_delta()
        old_top = self.top()
        keys = [*self.data_cols, SKEY]
        # fold by grouping, not joining: polars joins do not match NaN with NaN reliably, its group-by does
        changes = d.rename({"__dn": N}).select(self.rows.columns).cast(self.rows.schema)
        merged = pl.concat([self.rows, changes]).group_by(keys, maintain_order=True).agg(
            pl.col(N).sum(), pl.col(SET).first())
        if merged.filter(pl.col(N) < 0).height:
            raise StateError(f"operator {self.op_id}: the change feed deleted rows the top-k state never saw; "
                             f"recapture the sketch")
        self.rows = merged.filter(pl.col(N) > 0).select(self.rows.columns)
        if self.buffer:
            self._trim()
        new_top = self.top()
        return self._diff(old_top, new_top)

    # -- indexed state: head, boundary, rest log -------------------------------------------------------------------

    def _process_indexed(self, d: pl.DataFrame) -> pl.DataFrame:
        """Fold the per-tuple changes ``d`` (``__dn``): those after the boundary go to the rest log (no output), the
        others into the head, whose top-k before and after give the output delta."""
        changes = d.rename({"__dn": N}).select(self.rows.columns).cast(self.rows.schema)
        if self.boundary is not None:
            head_part, rest_part = self._split_at_boundary(changes)
            if rest_part.height:
                self.log = pl.concat([self.log, rest_part], rechunk=False)
                if self.log.height > max(self.compact_min, COMPACT_FRACTION * self.base_rows):
                    self._compact_rest()
            if head_part.height == 0:
                return self.empty_delta()
        else:
            head_part = changes
        old_top = self._top if self._top is not None else self.top()
        # ``head_part`` has one row per tuple already: into an empty head (a capture) it goes as it is
        self.rows = self._compacted(pl.concat([self.rows, head_part])) if self.rows.height else \
            self._compacted(head_part, grouped=True)
        total = int(self.rows.get_column(N).sum() or 0)
        if total < self.k and self.rest_rows:
            self._rebuild()  # deletions emptied the head: refill it from the rest
        elif self.rows.height > 2 * self.head_target:
            self._trim_head()
        self._top = self.top()  # refills and trims move rows between head and rest, never change the answer
        return self._diff(old_top, self._top)

    def _split_at_boundary(self, d: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``d``'s rows ranked at or before the boundary (into the head) and after it (into the rest)."""
        keep = self._boundary_rows(d)
        mask = np.zeros(d.height, dtype=bool)
        mask[keep.to_numpy()] = True
        m = pl.Series(mask)
        return d.filter(m), d.filter(~m)

    def _compacted(self, rows: pl.DataFrame, grouped: bool = False) -> pl.DataFrame:
        """``rows`` (signed changes) summed per tuple (unless ``grouped``: one row per tuple already), zero counts
        dropped; a negative count is a StateError."""
        merged = rows if grouped else rows.group_by([*self.data_cols, SKEY], maintain_order=True).agg(
            pl.col(N).sum(), pl.col(SET).first())
        if merged.filter(pl.col(N) < 0).height:
            raise StateError(f"operator {self.op_id}: the change feed deleted rows the top-k state never saw; "
                             f"recapture the sketch")
        return merged.filter(pl.col(N) > 0).select(self.rows.columns)

    def _compact_rest(self) -> None:
        """The log folded into a new base (a new chunk: the next save writes it once)."""
        self._set_base(self._compacted(self.rest()).rechunk())

    def _set_base(self, rows: pl.DataFrame) -> None:
        self.base = Chunk.of(rows) if rows.height else None
        self.base_rows = rows.height
        self.log = self.rows.clear()

    def _rebuild(self) -> None:
        """All rows into the head, then the head trimmed to its target, the rows after it the new base (one full
        sort; capture and refills)."""
        self.rows = self.all_rows()
        self._set_base(self.rows.clear())
        self.boundary = None
        self._trim_head()

    def _trim_head(self) -> None:
        """Keep in the head the tie groups up to the one holding the ``head_target``-th row; the later rows join the
        rest and the last kept order key becomes the boundary."""
        if int(self.rows.get_column(N).sum() or 0) <= self.head_target:
            return
        by = [f"__o{i}" for i in range(len(self.order))]
        s, groups = self._tie_groups(self._sorted(self.rows))
        kept = groups.filter(pl.col("__pos") < self.head_target)
        last = int(kept.get_column("__grp").max())  # type: ignore[arg-type]
        cut = int(s.get_column("__grp").search_sorted(last, side="right"))
        if cut == s.height:
            return
        moved = s.slice(cut).select(self.rows.columns)  # tuples never in the rest (each tuple lives on one side)
        self.rows = s.head(cut).select(self.rows.columns)
        if self.base is None and self.log.height == 0:
            self._set_base(moved.rechunk())  # a capture or refill: the moved rows are the whole rest
        else:
            self.log = pl.concat([self.log, moved], rechunk=False)
        self.boundary = s.slice(cut - 1, 1).select(by)

    # -- a cut buffer (paper 7.2) ----------------------------------------------------------------------------------

    def _within_boundary(self, d: pl.DataFrame) -> pl.DataFrame:
        """The changes ranked at or before the boundary (the others concern rows the buffer does not hold)."""
        keep = self._boundary_rows(d)
        return d.filter(pl.int_range(pl.len()).is_in(keep.implode()))

    def _boundary_rows(self, d: pl.DataFrame) -> pl.Series:
        """The row indices of ``d`` ranked at or before the boundary (ties with it included)."""
        assert self.boundary is not None
        by = [f"__o{i}" for i in range(len(self.order))]
        keyed = d.with_columns(self._order_exprs).with_columns(pl.lit(0, pl.Int8).alias("__b"),
                                                               pl.int_range(pl.len()).alias("__i"))
        marker = self.boundary.select(by).with_columns(pl.lit(1, pl.Int8).alias("__b"),
                                                       pl.lit(-1, pl.Int64).alias("__i"))
        both = pl.concat([keyed.select([*by, "__b", "__i"]), marker], how="vertical_relaxed")
        ordered = both.sort(by=[*by, "__b"], descending=[s.descending for s in self.order] + [False],
                            nulls_last=[not s.effective_nulls_first for s in self.order] + [False],
                            maintain_order=True)
        cut = int(ordered.get_column("__b").arg_max())  # type: ignore[arg-type]
        return ordered.head(cut).get_column("__i")

    def _trim(self) -> None:
        """Keep the rows up to the tie group holding the ``buffer``-th row; remember the boundary."""
        total = int(self.rows.get_column(N).sum() or 0)
        if self.truncated and total < self.k:
            raise BufferExhaustedError(f"operator {self.op_id}: deletions left {total} rows in a top-{self.k} buffer "
                                       f"of {self.buffer}; the sketch must be recaptured")
        if total <= self.buffer:
            return
        by = [f"__o{i}" for i in range(len(self.order))]
        s, groups = self._tie_groups(self._sorted(self.rows))
        last = int(groups.filter(pl.col("__pos") < self.buffer).get_column("__grp").max())  # type: ignore[arg-type]
        kept = s.filter(pl.col("__grp") <= last)
        if kept.height == s.height:
            return
        self.rows = kept.select(self.rows.columns)
        self.boundary = kept.tail(1).select(by)
        self.truncated = True

    def _diff(self, old_top: pl.DataFrame, new_top: pl.DataFrame) -> pl.DataFrame:
        both = pl.concat([old_top.with_columns(-pl.col(MULT)), new_top])
        keys = [*self.data_cols, SKEY]
        out = both.group_by(keys).agg(pl.col(MULT).sum(), pl.col(SET).first())
        out = out.filter(pl.col(MULT) != 0)
        return out.select([*self.data_cols, MULT, SET])

    def output_relation(self) -> pl.DataFrame:
        top = self._top if self.indexed and self._top is not None else self.top()
        return top.select([*self.data_cols, MULT, SET])

    def empty_delta(self) -> pl.DataFrame:
        return pl.DataFrame(schema={**self.schema, MULT: pl.Int64, SET: SET_DTYPE})


def group_number(by: list[str]) -> pl.Expr:
    """In a sorted frame, the 1-based number of each row's group of equal ``by`` values."""
    change = pl.lit(False)
    for c in by:
        change = change | pl.col(c).ne_missing(pl.col(c).shift(1))
    return change.fill_null(True).cum_sum()


__all__ = ["TopKOp", "group_number"]
