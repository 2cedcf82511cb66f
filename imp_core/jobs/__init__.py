"""The jobs ``spark-submit`` runs for Airflow: each a value that writes its command line and reads it back.

``spark-submit SUBMIT_PATH <job.argv()>`` runs a job (:mod:`imp_core.jobs.submit`); :func:`parse_job` is that entry
point's parser. Every value goes as ``--option=VALUE``, so a value starting with ``-`` (a SQL comment, say) stays a
value; no secret ever goes into an argv (Spark and Airflow log it). Field values may be Jinja templates in DAG files.
Import-light: DAG files import this while the DAG processor parses them. See docs/ARCHITECTURE.md, "Where each part
lives".
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from imp_core.cli.scaffold import (
    OneLineParser,
    batch_size_option,
    recapture_option,
    settings_options,
    sketch_name,
    strategy_option,
)
from imp_core.errors import UsageError
from imp_core.maintenance.strategy import Strategy

SUBMIT_PATH: str = str(Path(__file__).resolve().with_name("submit.py"))
"""Absolute path of the ``spark-submit`` application (``imp_core/jobs/submit.py``)."""

DEFAULT_TRIGGER = "spark-submit"
AIRFLOW_TRIGGER = "airflow:{{ dag.dag_id }}/{{ run_id }}"
"""The trigger a DAG gives its jobs, as a template (:func:`airflow_trigger` at run time)."""


def airflow_trigger(dag_id: str, run_id: str) -> str:
    """What a DAG run's jobs record as their trigger: ``airflow:<dag_id>/<run_id>``."""
    return f"airflow:{dag_id}/{run_id}"


@dataclass(frozen=True)
class MaintainJob:
    """Bring one sketch to the current table versions."""

    COMMAND: ClassVar[str] = "maintain"
    sketch: str
    strategy: Strategy | str | None = None  # None: the sketch's own
    batch_size: int | str | None = None
    trigger: str = DEFAULT_TRIGGER
    no_recapture: bool = False

    def argv(self) -> list[str]:
        return _argv(self.COMMAND, sketch=self.sketch, strategy=self.strategy, batch_size=self.batch_size,
                     trigger=self.trigger, no_recapture=self.no_recapture)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--sketch", required=True, type=sketch_name)
        strategy_option(parser, help="default: the sketch's strategy")
        batch_size_option(parser)
        recapture_option(parser)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MaintainJob:
        return cls(args.sketch, args.strategy, args.batch_size, args.trigger, args.no_recapture)

    @classmethod
    def parse(cls, argv: Sequence[str]) -> MaintainJob:
        """The job ``argv`` describes (``argv()`` read back).

        Raises:
            UsageError: ``argv`` is not a valid ``maintain`` job.
        """
        job = parse_job(argv)
        if not isinstance(job, cls):
            raise UsageError(f"{list(argv)!r} is a {job.COMMAND} job, not a {cls.COMMAND} job")
        return job


@dataclass(frozen=True)
class MaintainGroupJob:
    """Maintain several sketches in one Spark application, each table's change feed read once for all of them."""

    COMMAND: ClassVar[str] = "maintain-group"
    sketches: tuple[str, ...]
    strategy: Strategy | str | None = None  # None: each sketch's own
    batch_size: int | str | None = None
    trigger: str = DEFAULT_TRIGGER
    no_recapture: bool = False

    def argv(self) -> list[str]:
        return _argv(self.COMMAND, sketch=tuple(self.sketches), strategy=self.strategy, batch_size=self.batch_size,
                     trigger=self.trigger, no_recapture=self.no_recapture)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--sketch", required=True, action="append", type=sketch_name,
                            help="a sketch of the group (repeat the option for each)")
        strategy_option(parser, help="default: each sketch's strategy")
        batch_size_option(parser)
        recapture_option(parser)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MaintainGroupJob:
        return cls(tuple(args.sketch), args.strategy, args.batch_size, args.trigger, args.no_recapture)


@dataclass(frozen=True)
class MaintainAllJob:
    """Maintain every stale sketch."""

    COMMAND: ClassVar[str] = "maintain-all"
    strategy: Strategy | str | None = Strategy.EAGER
    batch_size: int | str | None = None
    trigger: str = DEFAULT_TRIGGER

    def argv(self) -> list[str]:
        return _argv(self.COMMAND, strategy=self.strategy, batch_size=self.batch_size, trigger=self.trigger)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        strategy_option(parser, default=Strategy.EAGER)
        batch_size_option(parser)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MaintainAllJob:
        return cls(args.strategy, args.batch_size, args.trigger)


@dataclass(frozen=True)
class RecaptureJob:
    """Full maintenance of one sketch."""

    COMMAND: ClassVar[str] = "recapture"
    sketch: str
    trigger: str = DEFAULT_TRIGGER

    def argv(self) -> list[str]:
        return _argv(self.COMMAND, sketch=self.sketch, trigger=self.trigger)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--sketch", required=True, type=sketch_name)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RecaptureJob:
        return cls(args.sketch, args.trigger)


@dataclass(frozen=True)
class RegisterJob:
    """The safety check and capture of a new sketch."""

    COMMAND: ClassVar[str] = "register"
    name: str
    sql: str
    on: tuple[str, ...]
    fragments: int | str | None = None
    bounds: tuple[str, ...] = ()
    strategy: Strategy | str | None = None
    dialect: str | None = None
    trigger: str = DEFAULT_TRIGGER

    def argv(self) -> list[str]:
        return _argv(self.COMMAND, name=self.name, sql=self.sql, on=self.on, fragments=self.fragments,
                     bounds=self.bounds, strategy=self.strategy, dialect=self.dialect, trigger=self.trigger)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", required=True, type=sketch_name)
        parser.add_argument("--sql", required=True)
        parser.add_argument("--on", action="append", required=True, metavar="TABLE.COLUMN")
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--fragments", type=int)
        group.add_argument("--bounds", action="append", metavar="b0,...,bn")
        strategy_option(parser, default_only=True, default=Strategy.LAZY)
        parser.add_argument("--dialect", default="spark")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RegisterJob:
        return cls(args.name, args.sql, tuple(args.on), args.fragments, tuple(args.bounds or ()), args.strategy,
                   args.dialect, args.trigger)


@dataclass(frozen=True)
class RepartitionJob:
    """Split over- and merge underflowing ranges of sketches (paper 7.4), each committed as a version."""

    COMMAND: ClassVar[str] = "repartition"
    sketches: tuple[str, ...]
    factor: float | str | None = None
    trigger: str = DEFAULT_TRIGGER

    def argv(self) -> list[str]:
        return _argv(self.COMMAND, sketch=tuple(self.sketches), factor=self.factor, trigger=self.trigger)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--sketch", required=True, action="append", type=sketch_name,
                            help="a sketch to repartition (repeat the option for each)")
        parser.add_argument("--factor", type=float, default=None,
                            help="split above FACTOR x the mean rows (default IMP_REPARTITION_FACTOR or 4)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RepartitionJob:
        return cls(tuple(args.sketch), args.factor, args.trigger)


Job = MaintainJob | MaintainGroupJob | MaintainAllJob | RecaptureJob | RegisterJob | RepartitionJob
JOBS: tuple[type[Job], ...] = (MaintainJob, MaintainGroupJob, MaintainAllJob, RecaptureJob, RegisterJob,
                               RepartitionJob)
COMMANDS = tuple(job.COMMAND for job in JOBS)
"""Subcommands of :data:`SUBMIT_PATH`."""


def job_parser() -> argparse.ArgumentParser:
    """The parser of the job entry point (``imp-job``), one subcommand per job."""
    common = settings_options(spark_master=False)  # spark-submit chooses the master
    common.add_argument("--trigger", default=DEFAULT_TRIGGER,
                        help="what started this job, recorded with the run (e.g. airflow:DAG_ID/RUN_ID)")
    parser: argparse.ArgumentParser = OneLineParser(prog="imp-job", description="imp jobs for spark-submit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser, required=True)
    for job in JOBS:
        job.add_arguments(sub.add_parser(job.COMMAND, parents=[common], help=job.__doc__))
    return parser


def parse_job(argv: Sequence[str]) -> Job:
    """The job an argv describes.

    Raises:
        UsageError: Not a valid job command line (one line naming what is wrong).
    """
    return job_from_args(job_parser().parse_args(list(argv)))


def job_from_args(args: argparse.Namespace) -> Job:
    """The job of parsed arguments (:func:`job_parser`)."""
    [job] = [job for job in JOBS if job.COMMAND == args.command]
    return job.from_args(args)


def sketch_of(argv: Sequence[str]) -> str:
    """The sketch a ``maintain`` job's argv names (for DAG templates: ``{{ sketch_of(task.application_args) }}``)."""
    return MaintainJob.parse(argv).sketch


def sketches_of(argv: Sequence[str]) -> tuple[str, ...]:
    """The sketches a ``maintain`` or ``maintain-group`` job's argv names."""
    job = parse_job(argv)
    if isinstance(job, MaintainJob):
        return (job.sketch,)
    if isinstance(job, MaintainGroupJob):
        return job.sketches
    raise UsageError(f"{list(argv)!r} is a {job.COMMAND} job, not a maintain or maintain-group job")


def group_label(sketches: Sequence[str], limit: int = 200) -> str:
    """A task's name listing its sketches (``a, b, c``), cut with ``(+N more)`` to fit ``limit`` characters (the
    length Airflow keeps of a mapped task's name)."""
    label = ", ".join(sketches)
    if len(label) <= limit:
        return label
    shown: list[str] = []
    for i, name in enumerate(sketches):
        more = f" (+{len(sketches) - i} more)"
        if len(", ".join([*shown, name])) + len(f" (+{len(sketches) - i - 1} more)") > limit:
            return ", ".join(shown) + more
        shown.append(name)
    return label


def _argv(command: str, **options: Any) -> list[str]:
    """``command --option=VALUE ...`` in the given order; None and "" are left out, True is a bare flag, a tuple
    repeats the option."""
    out = [command]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value == "" or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (tuple, list)):
            out += [f"{flag}={v}" for v in value]
        else:
            out.append(f"{flag}={value}")
    return out


__all__ = ["AIRFLOW_TRIGGER", "COMMANDS", "DEFAULT_TRIGGER", "JOBS", "SUBMIT_PATH", "Job", "MaintainAllJob",
           "MaintainGroupJob", "MaintainJob", "RecaptureJob", "RegisterJob", "RepartitionJob", "airflow_trigger",
           "group_label",
           "job_from_args", "job_parser", "parse_job", "sketch_of", "sketches_of"]
