"""The jobs' command lines (``imp_core/jobs``): each job value writes its argv and reads it back, no positions."""

from __future__ import annotations

import pytest

from imp_core.errors import UsageError
from imp_core.jobs import (
    AIRFLOW_TRIGGER,
    MaintainAllJob,
    MaintainGroupJob,
    MaintainJob,
    RecaptureJob,
    RegisterJob,
    RepartitionJob,
    airflow_trigger,
    group_label,
    parse_job,
    sketch_of,
    sketches_of,
)
from imp_core.maintenance.strategy import Strategy

JOBS = [
    MaintainJob("top", Strategy.EAGER, 500, "airflow:d/r", no_recapture=True),
    MaintainJob("top"),
    MaintainGroupJob(("a", "b-2", "c_3"), Strategy.EAGER, 1000, "airflow:d/r"),
    MaintainGroupJob(("only",), no_recapture=True),
    MaintainAllJob(Strategy.LAZY, 10),
    RecaptureJob("top", "cli"),
    RegisterJob("top", "-- a comment first\nSELECT brand FROM sales", ("sales.price", "other.x"),
                bounds=("1,2,3", "4,5"), strategy=Strategy.EAGER, dialect="postgres"),
    RegisterJob("g", "SELECT 1", ("t.a",), fragments=10, strategy=Strategy.LAZY, dialect="spark"),
    RepartitionJob(("a", "b"), 3.5, "airflow:d/r"),
    RepartitionJob(("only",)),
]


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"{j.COMMAND}:{' '.join(j.argv()[1:3])}")
def test_a_job_reads_back_from_its_argv(job) -> None:  # noqa: ANN001
    argv = job.argv()
    assert argv[0] == job.COMMAND and all(a.startswith("--") for a in argv[1:])
    again = parse_job(argv)
    assert type(again) is type(job)
    assert again.argv() == argv and again == job


def test_parsing_fills_the_defaults() -> None:
    job = parse_job(RegisterJob("g", "SELECT 1", ("t.a",), fragments=10).argv())
    assert (job.strategy, job.dialect, job.trigger) == (Strategy.LAZY, "spark", "spark-submit")


def test_dag_templates_pass_through_and_the_sketch_is_found_by_name() -> None:
    argv = MaintainJob("{{ params.sketch }}", "{{ params.strategy }}", "{{ params.batch_size }}",
                       AIRFLOW_TRIGGER).argv()
    assert argv[:2] == ["maintain", "--sketch={{ params.sketch }}"]
    assert sketch_of(["maintain", "--trigger=x", "--sketch=top_1"]) == "top_1"
    assert airflow_trigger("dag", "run") == "airflow:dag/run"


@pytest.mark.parametrize("argv, message", [
    (["maintain"], "--sketch"),
    (["maintain", "--sketch=top", "--strategy=fast"], "strategy must be one of lazy, eager, recapture"),
    (["register", "--name=x", "--sql=SELECT 1", "--on=t.a", "--fragments=3", "--strategy=recapture"],
     "strategy must be one of lazy, eager"),
    (["maintain", "--sketch=bad name"], "sketch name 'bad name' is not valid"),
    (["teleport"], "invalid choice"),
])
def test_a_bad_argv_is_one_usage_error(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        parse_job(argv)
    assert "\n" not in str(caught.value)


def test_maintain_job_parse_refuses_another_job() -> None:
    with pytest.raises(UsageError, match="is a recapture job, not a maintain job"):
        MaintainJob.parse(RecaptureJob("top").argv())


def test_group_jobs_name_their_sketches_and_tasks_list_them() -> None:
    argv = MaintainGroupJob(("a", "b")).argv()
    assert argv[:3] == ["maintain-group", "--sketch=a", "--sketch=b"]
    assert sketches_of(argv) == ("a", "b") and sketches_of(MaintainJob("t").argv()) == ("t",)
    with pytest.raises(UsageError, match="not a maintain or maintain-group job"):
        sketches_of(RecaptureJob("t").argv())
    names = [f"sketch_{i:03d}" for i in range(40)]
    label = group_label(names)
    assert len(label) <= 200 and label.startswith("sketch_000, sketch_001") and label.endswith(" more)")
    shown = label.split(" (+")[0].split(", ")
    assert label.endswith(f"(+{len(names) - len(shown)} more)") and shown == names[:len(shown)]
    assert group_label(["a", "b"]) == "a, b"
