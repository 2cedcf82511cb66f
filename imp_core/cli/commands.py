"""One handler per ``imp`` subcommand: each makes one call into the service façade and prints its answer (JSON with
``--json``, a table or a line otherwise).

See docs/ARCHITECTURE.md, "Where each part lives".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from imp_core.catalog.embedded import embedded_url, stop_embedded
from imp_core.cli.scaffold import settings_from
from imp_core.config import Settings, redact_url
from imp_core.demo import run_demo
from imp_core.errors import GroupFailedError, SourceError, UsageError
from imp_core.maintenance.service import SketchService
from imp_core.maintenance.strategy import Strategy

Handler = Callable[[argparse.Namespace], int]


class Progress:
    """Progress on stderr: each step with its elapsed time, and a spinner on the running step (on a terminal), so
    nothing that takes more than a few seconds looks hung; stdout stays clean for ``--json``."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.started = time.perf_counter()
        self.status = self.console.status("working", spinner="dots") if self.console.is_terminal else None
        if self.status is not None:
            self.status.start()

    def __call__(self, msg: str) -> None:
        self.console.print(f"[dim]{time.perf_counter() - self.started:6.1f}s …[/dim] {msg}", highlight=False)
        if self.status is not None:
            self.status.update(msg)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


def settings(args: argparse.Namespace) -> Settings:
    return settings_from(args, lambda message: sys.stderr.write(f"imp: warning: {message}\n"))


def with_service(run: Callable[[argparse.Namespace, SketchService], int]) -> Handler:
    """A handler that gets a service on the settings of its flags, with progress shown while it works."""

    def handler(args: argparse.Namespace) -> int:
        progress = Progress()
        try:
            return run(args, SketchService(settings(args), progress=progress))
        finally:
            progress.stop()

    handler.__doc__ = run.__doc__
    return handler


def needs_action(command: str, actions: str) -> Handler:
    """The handler of ``imp COMMAND`` without its action."""

    def handler(args: argparse.Namespace) -> int:
        raise UsageError(f"imp {command}: give an action ({actions})")

    return handler


def no_command(args: argparse.Namespace) -> int:
    raise UsageError("no command given; try `imp demo` or `imp --help`")


# -- output ---------------------------------------------------------------------------------------------------------


def emit(args: argparse.Namespace, obj: Any, text: Callable[[], None]) -> int:
    """``obj`` as JSON with ``--json``, else ``text()``; exit code 0."""
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    else:
        text()
    return 0


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    t = Table(title=title, show_lines=False)
    for c in columns:
        t.add_column(str(c))
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    Console().print(t)


def fragments_line(parts: list[dict[str, Any]]) -> str:
    return "; ".join(f"{p['table']}.{p['column']}: {p['fragments']}" for p in parts)


# -- handlers -------------------------------------------------------------------------------------------------------


@with_service
def table_register(args: argparse.Namespace, service: SketchService) -> int:
    """imp table register NAME (PATH | --table CATALOG.DB.TABLE)"""
    rec = service.register_table(args.name, args.path, replace=args.replace, table=args.table)
    info = {"name": rec.name, "path": rec.path, "version": rec.observed_version}
    return emit(args, info, lambda: print(f"registered table {rec.name} ({rec.path}, version {rec.observed_version})"))


@with_service
def table_list(args: argparse.Namespace, service: SketchService) -> int:
    """imp table list"""
    rows = service.list_tables()
    return emit(args, rows, lambda: table("tables", ["name", "path", "observed version"],
                                          [[r["name"], r["path"], r["observed_version"]] for r in rows]))


@with_service
def table_layout(args: argparse.Namespace, service: SketchService) -> int:
    """imp table layout [NAME] [--apply] [--threshold X] | NAME --on | NAME --off"""
    if args.on or args.off:
        if args.name is None or args.apply:
            raise UsageError("--on/--off switch one table: imp table layout TABLE --off (no --apply)")
        record = service.set_layout_maintenance(args.name, bool(args.on))
        state = "re-clusters" if record.layout_maintenance else "leaves alone"
        return emit(args, {"table": record.name, "layout_maintenance": record.layout_maintenance},
                    lambda: print(f"table {record.name}: the layout pass {state} it from now on"))
    failed: list[str] = []
    if args.apply:
        done = service.relayout(args.name, args.threshold)
        rows = [d.to_json() for d in done]
        failed = [f"{d.before.table} ({d.error})" for d in done if d.failed]
    else:
        rows = [t.to_json() for t in service.layout(args.name)]

    def text() -> None:
        table("what sketched scans read, against the table clustered by the sketched columns",
              ["table", "version", "files", "sketch", "files read", "rows read", "excess cost"],
              [[r["table"], r["version"], r["files"], s["sketch"], s["files_read"], s["rows_read"],
                f"{s['excess_share']:.0%}"] for r in rows for s in r["sketches"]]
              or [[r["table"], r["version"], r["files"], "(no usable sketch)", "", "", ""] for r in rows])
        for r in rows:
            after = r.get("after")
            if after is not None:
                print(f"table {r['table']}: clustered by {', '.join(r['columns'])} at version {after['version']}: "
                      f"excess cost of sketched scans {r['excess_share']:.0%} -> {after['excess_share']:.0%}, "
                      f"{r['files']} -> {after['files']} files")
            elif r.get("outcome"):
                print(f"table {r['table']}: {r['outcome']}" + (f": {r['error']}" if r.get("error") else ""))

    code = emit(args, rows, text)
    if failed:
        raise SourceError(f"re-clustering failed for {', '.join(failed)}; the other tables were done")
    return code


@with_service
def sketch_create(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch create NAME --sql SQL --on TABLE.COLUMN (--fragments N | --bounds ...) [--replace]"""
    record, version = service.create_sketch(args.name, args.sql, args.on, fragments=args.fragments,
                                            bounds=args.bounds, dialect=args.dialect, strategy=args.strategy,
                                            replace=args.replace)
    info = service.describe(record.name)
    return emit(args, info, lambda: print(f"sketch {record.name} version {version.version} captured at "
                                          f"{dict(version.table_versions)}: {fragments_line(info['partitions'])}"))


@with_service
def sketch_maintain(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch maintain (NAME | --all) [--strategy S] [--batch-size ROWS]"""
    if args.all and args.name:
        raise UsageError("give a sketch name or --all, not both")
    if args.all:
        results = service.maintain_all(args.strategy or Strategy.EAGER, args.batch_size)
    elif args.name:
        results = [service.maintain(args.name, args.strategy, args.batch_size, allow_recapture=not args.no_recapture)]
    else:
        raise UsageError("imp sketch maintain: give a sketch name or --all")
    out = [{"name": r.sketch, "versions": [v.version for v in r.versions], "delta_rows": r.delta_rows,
            "recaptured": r.recaptured, "up_to_date": r.up_to_date} for r in results]

    def text() -> None:
        if not out:
            print("no stale sketches")
        for r in out:
            if r["up_to_date"]:
                print(f"sketch {r['name']} is up to date")
                continue
            extra = f"; recaptured because {r['recaptured']}" if r["recaptured"] else ""
            print(f"sketch {r['name']}: committed version(s) {r['versions']} from {r['delta_rows']} change rows"
                  f"{extra}")
            print("  " + fragments_line(service.describe(str(r["name"]))["partitions"]))

    return emit(args, out if args.all else out[0], text)


@with_service
def sketch_recapture(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch recapture NAME"""
    version = service.recapture(args.name)
    info = service.describe(args.name)
    return emit(args, info, lambda: print(f"sketch {args.name} recaptured as version {version.version}: "
                                          f"{fragments_line(info['partitions'])}"))


@with_service
def sketch_show(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch show NAME [--version N | --as-of-table-version TABLE=V]"""
    as_of = None
    if args.as_of_table_version:
        t, _, v = args.as_of_table_version.partition("=")
        if not v.strip().lstrip("-").isdigit():
            raise UsageError("--as-of-table-version takes TABLE=VERSION, e.g. sales=3")
        as_of = (t, int(v))
    info = service.describe(args.name, version=args.version, as_of=as_of)

    def text() -> None:
        table(f"sketch {info['name']} v{info['version']} ({info['method']})",
              ["table", "column", "fragments", "of", "covered"],
              [[p["table"], p["column"], p["fragments"], p["fragment_count"], f"{p['covered_share']:.1%}"]
               for p in info["partitions"]])
        print(f"valid for table versions {info['table_versions']}")
        if info["state"]:
            table("operator state", ["operator", "where", "MB", "rows"],
                  [[s["operator"], s["where"], f"{(s['bytes'] or 0) / (1 << 20):.1f}",
                    "" if s["rows"] is None else s["rows"]] for s in info["state"]])
        if not info["usable"]:
            print(f"UNUSABLE since {info['unusable_since']}: {info['unusable_reason']}; queries run without it "
                  f"until it is registered again (`imp sketch create {info['name']} --replace ...`)")

    return emit(args, info, text)


@with_service
def sketch_predicate(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch predicate NAME [--table TABLE]"""
    p = service.sketch_predicate(args.name, args.table)

    def text() -> None:
        print(p.predicate)
        print(f"-- sketch {p.sketch} v{p.version}: {p.fragments} of {p.fragment_count} fragments of {p.table}."
              f"{p.column}; valid for {p.table} at version {p.table_version} (read it there, e.g. "
              f"VERSION AS OF {p.table_version}, or maintain the sketch first)", file=sys.stderr)

    return emit(args, dataclasses.asdict(p), text)


@with_service
def sketch_repartition(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch repartition NAME [--apply] [--factor F] | --all"""
    if (args.name is None) == (not args.all):
        raise UsageError("give a sketch name or --all (every usable sketch, applied)")
    if args.all:
        done = service.repartition_all(args.factor)

        def summary() -> None:
            table(f"ranges of every usable sketch (split above {args.factor:g}x the mean rows)",
                  ["sketch", "changed", "version", "error"],
                  [[d["sketch"], "yes" if d.get("changed") else "no", d.get("version") or "", d.get("error", "")]
                   for d in done])

        emit(args, done, summary)
        failed = [d["sketch"] for d in done if d.get("error")]
        if failed:
            raise GroupFailedError(f"repartition failed for {len(failed)} sketch(es): {', '.join(failed)}; see "
                                   f"their errors above")
        return 0
    result = service.repartition(args.name, args.factor, args.apply)

    def text() -> None:
        table(f"ranges of sketch {result.sketch} (split above {result.factor:g}x the mean rows)",
              ["table", "column", "fragments", "largest / mean", "split", "merged", "rows moved"],
              [[t.table, t.column, f"{t.fragments_before} -> {t.fragments_after}", f"{t.skew_before:g} -> "
                f"{t.skew_after:g}", ", ".join(f"{s['fragment']} into {s['pieces']}" for s in t.splits) or "-",
                ", ".join(f"{m['fragments'][0]}-{m['fragments'][1]}" for m in t.merges) or "-", t.rows_moved]
               for t in result.tables])
        if result.version is not None:
            print(f"committed version {result.version.version} of sketch {result.sketch} (method repartition)")
        elif result.changed:
            print("nothing committed; run again with --apply to split and merge these ranges")
        else:
            print("every range is within the factor; nothing to do")

    return emit(args, result.to_json(), text)


@with_service
def sketch_advise(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch advise --sql SQL [--table TABLE]"""
    advice = service.advise(args.sql, args.table, args.fragments, args.dialect, args.max_columns)

    def share(x: float | None) -> str:
        return "" if x is None else f"{x:.1%}"

    def text() -> None:
        table("sketch columns for this query, best first",
              ["column", "safe", "rows kept", "files read", "fragments in sketch", "why / notes"],
              [[f"{a.table}.{a.column}", "yes" if a.safe else "no", share(a.row_share),
                f"{a.files_read} of {a.files}" if a.file_share is not None else "",
                f"{a.sketch_fragments} of {a.fragments}" if a.row_share is not None else "",
                "; ".join(a.notes) if a.safe else a.reason] for a in advice])
        best = advice[0]
        print(f"register it with: imp sketch create NAME --sql '...' --on {best.table}.{best.column} "
              f"--fragments {args.fragments}")

    return emit(args, [a.to_json() for a in advice], text)


@with_service
def sketch_list(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch list"""
    rows = service.sketch_list()  # current versions, and tables that changed identity

    def text() -> None:
        table("sketches", ["name", "version", "method", "table versions", "current", "state", "last run"],
              [[r.get("name"), r.get("latest_version"), r.get("latest_method"), r.get("table_versions"),
                r.get("current_table_versions"),
                "UNUSABLE" if not r.get("usable", True) else "stale" if r.get("is_stale") else "fresh",
                r.get("last_run_status")] for r in rows])
        for r in rows:
            if not r.get("usable", True):
                print(f"sketch {r['name']} is unusable: {r['unusable_reason']}; drop and re-create it to use a "
                      f"sketch again")

    return emit(args, rows, text)


@with_service
def sketch_history(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch history NAME"""
    rows = service.history(args.name)
    return emit(args, rows, lambda: table(
        f"history of {args.name}", ["version", "method", "table versions", "delta rows", "ms", "state"],
        [[r["version"], r["method"] + (f" ({r['reason']})" if r["reason"] else ""), r["table_versions"],
          r["delta_rows"], f"{r['duration_ms']:.0f}" if r["duration_ms"] else "", r["has_state"]] for r in rows]))


@with_service
def sketch_drop(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch drop NAME"""
    service.drop_sketch(args.name)
    print(f"dropped sketch {args.name}")
    return 0


@with_service
def sketch_publish(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch publish [NAME]"""
    if args.name is None and not args.all:
        raise UsageError("name a sketch or give --all")
    done = service.publish(args.name)
    rows = [{"sketch": p.sketch, "version": p.version, "file": p.file, "usable": p.usable} for p in done]

    def show() -> None:
        for r in rows:
            print(f"published {r['sketch']} v{r['version']} to {r['file']}"
                  + ("" if r["usable"] else " (unusable: queries run without it)"))
        if not rows:
            print("every sketch is published")

    return emit(args, rows, show)


@with_service
def sketch_explain(args: argparse.Namespace, service: SketchService) -> int:
    """imp sketch explain --sql SQL"""
    result = service.explain(args.sql, args.dialect)

    def text() -> None:
        for s in result.sketches:
            verdict = f"applies ({s['detail']})" if s["applies"] else f"not applied: {s['reason']}"
            print(f"sketch {s['sketch']} v{s['version']}: {verdict}")
        for p in result.locations:
            print(f"note: {p.get('file') or p['location']}: {p['reason']}")
        if not result.sketches:
            print("no published sketch reads these tables")

    return emit(args, result.to_json(), text)


@with_service
def query(args: argparse.Namespace, service: SketchService) -> int:
    """imp query SQL"""
    result = service.query(args.sql, args.dialect, use_sketch=not args.no_sketch, capture=args.capture, on=args.on,
                           fragments=args.fragments)

    def text() -> None:
        table("result", result.columns, result.rows)
        s = result.scanned
        used = f"sketch {result.sketch['name']} v{result.sketch['version']}" if result.sketch else "no sketch"
        print(f"{used}; read {s.files_read}/{s.files_total} files, {s.rows_read}/{s.rows_total} rows; "
              f"{result.seconds:.2f} s")
        for note in result.notes:
            print(f"note: {note}")

    return emit(args, result.to_json(), text)


def demo(args: argparse.Namespace) -> int:
    """imp demo"""
    return run_demo(settings(args), rows=args.rows, small_only=args.small_only)


def catalog_url(args: argparse.Namespace) -> int:
    """imp catalog url: an embedded catalog's URL names its password file, never the password; a configured one
    is redacted."""
    resolved = settings(args)
    url = redact_url(resolved.catalog_url) if resolved.catalog_url else embedded_url(resolved)
    print(url.replace("+psycopg2", "") if args.psql else url)
    return 0


def catalog_stop(args: argparse.Namespace) -> int:
    """imp catalog stop"""
    print("embedded catalog stopped" if stop_embedded(settings(args)) else "embedded catalog was not running")
    return 0


__all__ = ["catalog_stop", "catalog_url", "demo", "needs_action", "no_command", "query", "sketch_create",
           "sketch_drop", "sketch_explain", "sketch_history", "sketch_publish", "sketch_list", "sketch_maintain",
           "sketch_recapture", "sketch_show", "table_list", "table_register"]
