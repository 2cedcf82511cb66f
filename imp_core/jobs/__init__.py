"""Job entry points that ``spark-submit`` runs (the Airflow DAGs submit them).

``SUBMIT_PATH`` is the file to hand to ``spark-submit`` (``SparkSubmitOperator(application=jobs.SUBMIT_PATH)``)::

    spark-submit --master local[*] $(python -c 'import imp_core.jobs as j; print(j.SUBMIT_PATH)') \\
        maintain --sketch=top --strategy=eager --batch-size=1000 --trigger=airflow:imp_nightly_maintenance/RUN

A job's command line is a value built here (:func:`maintain_argv`, :func:`register_argv`) and read back by
:func:`sketch_of`; the job's parser is ``imp_core/jobs/submit.py``. Every value is passed as ``--option=VALUE``, so a
value that starts with ``-`` (a SQL comment, say) stays a value. Secrets never go into the argv: Spark's and Airflow's
logs print it; the catalog URL reaches the job through the environment or a private file (``IMP_CATALOG_URL_FILE``).

This module stays import-light: DAG files import it while the DAG processor parses them.
"""

from __future__ import annotations

from pathlib import Path

SUBMIT_PATH: str = str(Path(__file__).resolve().with_name("submit.py"))
"""Absolute path of the ``spark-submit`` application (``imp_core/jobs/submit.py``)."""

COMMANDS = ("maintain", "maintain-all", "recapture", "register")
"""Subcommands of :data:`SUBMIT_PATH`."""



def maintain_argv(sketch: str, strategy: str | None = None, batch_size: int | str | None = None,
                  trigger: str | None = None) -> list[str]:
    """``application_args`` of a ``maintain`` job (values may be Jinja templates in DAG files)."""
    args = ["maintain", f"--sketch={sketch}"]
    if strategy:
        args.append(f"--strategy={strategy}")
    if batch_size is not None and batch_size != "":
        args.append(f"--batch-size={batch_size}")
    if trigger:
        args.append(f"--trigger={trigger}")
    return args


def register_argv(name: str, sql: str, on: str, fragments: int | str, strategy: str | None = None,
                  trigger: str | None = None) -> list[str]:
    """``application_args`` of a ``register`` job (values may be Jinja templates in DAG files)."""
    args = ["register", f"--name={name}", f"--sql={sql}", f"--on={on}", f"--fragments={fragments}"]
    if strategy:
        args.append(f"--strategy={strategy}")
    if trigger:
        args.append(f"--trigger={trigger}")
    return args


def sketch_of(argv: list[str] | tuple[str, ...]) -> str:
    """The sketch a ``maintain`` job's ``application_args`` names (``--sketch=NAME`` or ``--sketch NAME``)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg.startswith("--sketch="):
            return arg[len("--sketch="):]
        if arg == "--sketch" and i + 1 < len(args):
            return args[i + 1]
    raise ValueError(f"no --sketch in {args!r}")


__all__ = ["COMMANDS", "SUBMIT_PATH", "maintain_argv", "register_argv", "sketch_of"]
