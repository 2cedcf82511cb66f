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
unusable (drop and re-create it); 70 internal error; 130 interrupted. Errors print one line on stderr
(:func:`imp_core.cli.scaffold.run_main`). See docs/ARCHITECTURE.md, "Where each part lives".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from imp_core.cli import commands
from imp_core.cli.scaffold import (
    OneLineParser,
    batch_size_option,
    recapture_option,
    run_main,
    settings_options,
    strategy_option,
)
from imp_core.maintenance.strategy import Strategy
from imp_core.sketch.repartition import DEFAULT_FACTOR


def build_parser() -> argparse.ArgumentParser:
    """The ``imp`` parser; every (sub)command sets its ``handler`` (:mod:`imp_core.cli.commands`)."""
    common = settings_options()
    parser = OneLineParser(prog="imp", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Keep provenance sketches fresh under updates so Spark queries skip data "
                                       "(IMP, EDBT 2026).",
                           epilog="Start with `imp demo`. Every command has --help with an example.")
    parser.set_defaults(handler=commands.no_command)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    _table_commands(_group(sub, common, "table", "register and list Delta tables, keep their layout fit for sketches",
                           "register, list, layout"), common)
    _sketch_commands(_group(sub, common, "sketch", "create, maintain and inspect sketches",
                            "see `imp sketch --help`"), common)

    qp = _command(sub, common, "query", commands.query,
                  "run a query, using (and lazily maintaining) a sketch when one can answer it",
                  "imp query \"SELECT brand, SUM(price*numSold) AS rev FROM sales GROUP BY brand HAVING "
                  "SUM(price*numSold) > 5000\" --json", "imp query \"...\" --capture --on sales.brand")
    qp.add_argument("sql")
    qp.add_argument("--no-sketch", action="store_true", help="run without any sketch")
    qp.add_argument("--capture", action="store_true", help="register a sketch when none can answer the query")
    qp.add_argument("--on", action="append", metavar="TABLE.COLUMN", help="with --capture: partition column")
    qp.add_argument("--fragments", type=int, default=100, help="with --capture: number of fragments (default 100)")
    qp.add_argument("--dialect", default="spark")

    dm = _command(sub, common, "demo", commands.demo,
                  "the paper's running example, then the same flow on a few million rows", "imp demo", json=False)
    dm.add_argument("--rows", type=int, default=3_000_000, help="rows of the generated table (default 3M)")
    dm.add_argument("--small-only", action="store_true", help="only the paper's running example")

    csub = _group(sub, common, "catalog", "the catalog database", "url, stop")
    cu = _command(csub, common, "url", commands.catalog_url, "print the catalog URL (password hidden)",
                  "psql \"$(imp catalog url --psql)\" -c 'SELECT * FROM sketch_catalog'", json=False)
    cu.add_argument("--psql", action="store_true", help="print it in the form psql/libpq accepts")
    _command(csub, common, "stop", commands.catalog_stop, "stop the embedded Postgres", "imp catalog stop", json=False)
    return parser


def _table_commands(tsub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    reg = _command(tsub, common, "register", commands.table_register,
                   "register a Delta table (Change Data Feed must be enabled)", "imp table register sales /data/sales",
                   "imp table register sales s3://bucket/lake/sales",
                   "imp table register sales --table spark_catalog.shop.sales")
    reg.add_argument("name", help="name used in SQL")
    reg.add_argument("path", nargs="?", help="path or URI (s3://...) of the Delta table")
    reg.add_argument("--table", metavar="CATALOG.DB.TABLE",
                     help="the table's name in the Spark catalog instead of a path (resolved now, checked on "
                          "every maintenance)")
    reg.add_argument("--replace", action="store_true", help="re-point an existing name to a new path")
    _command(tsub, common, "list", commands.table_list, "list registered tables", "imp table list")
    lay = _command(tsub, common, "layout", commands.table_layout,
                   "what sketched scans cost against the table clustered by the sketched columns; --apply re-clusters",
                   "imp table layout", "imp table layout sales --apply --threshold 0.3 --json",
                   "imp table layout sales --off")
    lay.add_argument("name", nargs="?", help="one table (default: every table a usable sketch partitions)")
    switch = lay.add_mutually_exclusive_group()
    switch.add_argument("--on", action="store_true", help="let the nightly layout task re-cluster the table (default)")
    switch.add_argument("--off", action="store_true", help="the nightly layout task leaves the table alone")
    lay.add_argument("--apply", action="store_true",
                     help="OPTIMIZE ZORDER BY the sketched columns where the share exceeds the threshold")
    lay.add_argument("--threshold", type=float, default=None,
                     help="share above which --apply re-clusters (default IMP_LAYOUT_THRESHOLD or 0.5)")


def _sketch_commands(ssub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    cr = _command(ssub, common, "create", commands.sketch_create, "register a sketch and capture it",
                  "imp sketch create top --sql \"SELECT brand, SUM(price*numSold) AS rev FROM sales GROUP BY brand "
                  "HAVING SUM(price*numSold) > 5000\" --on sales.price --bounds 1,601,1001,1501,10001",
                  "imp sketch create g --sql \"...\" --on t.a --fragments 1000",
                  "imp sketch create g --sql \"...\" --on auto --fragments 100")
    cr.add_argument("name")
    cr.add_argument("--sql", required=True, help="the SELECT query")
    cr.add_argument("--on", action="append", required=True, metavar="TABLE.COLUMN",
                    help="partition column (repeat for several tables), or auto: the column `imp sketch advise` "
                         "ranks first")
    group = cr.add_mutually_exclusive_group(required=True)
    group.add_argument("--fragments", type=int, help="number of equi-depth fragments picked from the data")
    group.add_argument("--bounds", action="append", metavar="b0,...,bn",
                       help="explicit bounds: n fragments [b_i, b_{i+1}); values below b0 fall in fragment 0, at "
                            "or above bn in fragment n-1 (repeat per --on)")
    strategy_option(cr, default_only=True, default=Strategy.LAZY, help="default maintenance strategy")
    cr.add_argument("--dialect", default="spark", help="SQL dialect of --sql (sqlglot name, default spark)")
    cr.add_argument("--replace", action="store_true",
                    help="replace the live sketch of this name (e.g. one made unusable by a schema change) in the "
                         "same commit that adds the new one; its versions stay for the record")

    mt = _command(ssub, common, "maintain", commands.sketch_maintain,
                  "bring a sketch (or all stale ones) to the current table versions", "imp sketch maintain top",
                  "imp sketch maintain top --strategy eager --batch-size 500",
                  "imp sketch maintain --all --strategy eager")
    mt.add_argument("name", nargs="?")
    mt.add_argument("--all", action="store_true", help="maintain every stale sketch (what the nightly DAG runs)")
    strategy_option(mt, help="default: the sketch's strategy")
    batch_size_option(mt)
    recapture_option(mt)

    sh = _command(ssub, common, "show", commands.sketch_show, "show a sketch version", "imp sketch show top --json",
                  "imp sketch show top --version 1", "imp sketch show top --as-of-table-version sales=3")
    sh.add_argument("name")
    which = sh.add_mutually_exclusive_group()
    which.add_argument("--version", type=int)
    which.add_argument("--as-of-table-version", metavar="TABLE=VERSION")

    for action, handler, help_text, example in (
            ("recapture", commands.sketch_recapture, "full maintenance (re-run the capture)", "recapture top"),
            ("history", commands.sketch_history, "list the versions of a sketch", "history top --json"),
            ("drop", commands.sketch_drop, "drop a sketch (its versions stay in the catalog)", "drop top")):
        _command(ssub, common, action, handler, help_text, f"imp sketch {example}", json=action != "drop") \
            .add_argument("name")
    _command(ssub, common, "list", commands.sketch_list, "list sketches with freshness", "imp sketch list --json")
    pb = _command(ssub, common, "publish", commands.sketch_publish,
                  "publish the latest version's manifest for the Spark extension (after a failed publish)",
                  "imp sketch publish top", "imp sketch publish --all")
    pb.add_argument("name", nargs="?")
    pb.add_argument("--all", action="store_true", help="every sketch whose latest version is not published")
    ex = _command(ssub, common, "explain", commands.sketch_explain,
                  "say whether the Spark extension applies each published sketch to a query, or why not",
                  "imp sketch explain --sql \"SELECT ...\"")
    ex.add_argument("--sql", required=True)
    ex.add_argument("--dialect", default="spark", help="SQL dialect of --sql (sqlglot name, default spark)")
    pr = _command(ssub, common, "predicate", commands.sketch_predicate,
                  "print the sketch's range predicate (Spark SQL) for your own queries",
                  "imp sketch predicate top", "imp sketch predicate top --table sales --json")
    pr.add_argument("name")
    pr.add_argument("--table", help="the table to restrict (default: the one table the sketch partitions)")
    rp = _command(ssub, common, "repartition", commands.sketch_repartition,
                  "split ranges that hold too many rows and merge neighbours that hold few (paper 7.4)",
                  "imp sketch repartition top", "imp sketch repartition top --apply --factor 3 --json",
                  "imp sketch repartition --all")
    rp.add_argument("name", nargs="?")
    rp.add_argument("--all", action="store_true", help="every usable sketch, applied (what the nightly DAG runs)")
    rp.add_argument("--apply", action="store_true", help="commit the new ranges as a version (default: only show)")
    rp.add_argument("--factor", type=float, default=DEFAULT_FACTOR,
                    help=f"split a range above FACTOR x the mean rows, merge neighbours below the mean / FACTOR "
                         f"(default {DEFAULT_FACTOR:g})")
    ad = _command(ssub, common, "advise", commands.sketch_advise,
                  "list the columns a sketch of a query is safe on, best first, with the data each would skip",
                  "imp sketch advise --sql \"SELECT brand, SUM(price) AS s FROM sales GROUP BY brand HAVING "
                  "SUM(price) > 100\"", "imp sketch advise --sql \"...\" --table sales --fragments 200 --json")
    ad.add_argument("--sql", required=True, help="the SELECT query")
    ad.add_argument("--table", help="only this table's columns (default: every table the query reads)")
    ad.add_argument("--fragments", type=int, default=100, help="equi-depth fragments per candidate (default 100)")
    ad.add_argument("--max-columns", type=int, default=10,
                    help="estimate at most this many safe columns (each costs a capture on Spark; default 10)")
    ad.add_argument("--dialect", default="spark", help="SQL dialect of --sql (sqlglot name, default spark)")


def _group(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, name: str, help_text: str,
           actions: str) -> argparse._SubParsersAction:
    """Command ``name`` whose actions are subcommands (the command alone says which exist)."""
    group = sub.add_parser(name, help=help_text, parents=[common])
    group.set_defaults(handler=commands.needs_action(name, actions))
    return group.add_subparsers(dest="action", metavar="ACTION", parser_class=OneLineParser)


def _command(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, name: str,
             handler: commands.Handler, help_text: str, *examples: str, json: bool = True) -> argparse.ArgumentParser:
    """Subcommand ``name`` run by ``handler``, with the settings flags, its examples as epilog and ``--json``."""
    epilog = ("example:" if len(examples) == 1 else "examples:") + "".join(f"\n  {e}" for e in examples)
    command = sub.add_parser(name, parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
                             help=help_text, epilog=epilog)
    if json:
        command.add_argument("--json", action="store_true")
    command.set_defaults(handler=handler)
    return command


def _dispatch(args: argparse.Namespace) -> int:
    handler: commands.Handler = args.handler
    return handler(args)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("imp", argv, build_parser, _dispatch, internal_hint=" (run with -v for details)")


if __name__ == "__main__":
    sys.exit(main())
