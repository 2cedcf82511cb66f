"""The ``spark-submit`` application (``imp-job``): runs one job of :mod:`imp_core.jobs` through the service façade.

Contract (the DAGs and tests rely on it): progress is logged on stderr; on success one JSON line with a ``job`` key
goes to stdout and the exit code is 0; on failure one line ``imp-job: error: ...`` goes to stderr and the exit code is
the error's (:func:`imp_core.cli.scaffold.run_main`), which spark-submit passes on. A group job whose sketches partly
failed writes its JSON line (what each sketch did) and then fails with exit code 9. (Spark's Python runner merges the
driver's stderr into spark-submit's stdout.) The catalog URL comes from ``IMP_CATALOG_URL`` or the private file named
by ``IMP_CATALOG_URL_FILE``. See docs/AIRFLOW.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from imp_core.cli.scaffold import run_main, settings_from
from imp_core.errors import GroupFailedError, ImpError, first_line
from imp_core.inputs import check_batch_size
from imp_core.jobs import (
    Job,
    MaintainAllJob,
    MaintainGroupJob,
    MaintainJob,
    RecaptureJob,
    RegisterJob,
    RepartitionJob,
    job_from_args,
    job_parser,
)
from imp_core.maintenance.maintain import MaintenanceResult
from imp_core.maintenance.repartition import factor_setting
from imp_core.maintenance.service import SketchService
from imp_core.maintenance.strategy import Strategy
from imp_core.security.redact import scrub

log = logging.getLogger("imp.jobs")


def run(service: SketchService, job: Job) -> dict[str, Any]:
    """Run ``job``; returns its JSON summary."""
    log.info("imp job %s (trigger %s, catalog %s)", job.COMMAND, job.trigger, service.catalog_url)
    out: dict[str, Any] = {"job": job.COMMAND, "status": "succeeded", "trigger": job.trigger}
    if isinstance(job, MaintainJob):
        log.info("maintaining sketch %s (strategy %s, batch size %s)", job.sketch, job.strategy or "default",
                 job.batch_size or "default")
        result = service.maintain(job.sketch, job.strategy, _count(job.batch_size), trigger=job.trigger,
                                  allow_recapture=not job.no_recapture)
        out.update(_result(result))
    elif isinstance(job, MaintainGroupJob):
        log.info("maintaining %d sketches as one group: %s (strategy %s, batch size %s)", len(job.sketches),
                 ", ".join(job.sketches), job.strategy or "each sketch's own", job.batch_size or "default")
        group = service.maintain_group(job.sketches, job.strategy, _count(job.batch_size), trigger=job.trigger,
                                       allow_recapture=not job.no_recapture)
        out["sketches"] = [_result(group.results[n]) for n in job.sketches if n in group.results]
        out["failed"] = group.failed
        out["unusable"] = group.unusable
        out["change_feed_reads"] = group.feed_reads
        out["spark_started"] = group.spark_started
        out["sketch_seconds"] = group.seconds
        error = group.error()
        if error is not None:
            out["status"], out["error"] = "failed", str(error)
    elif isinstance(job, MaintainAllJob):
        log.info("maintaining every stale sketch (strategy %s, batch size %s)", job.strategy,
                 job.batch_size or "default")
        results = service.maintain_all(job.strategy or Strategy.EAGER, _count(job.batch_size), trigger=job.trigger)
        out["sketches"] = [_result(r) for r in results]
        out["versions_made"] = sum(len(r.versions) for r in results)
        out["delta_rows"] = sum(r.delta_rows for r in results)
    elif isinstance(job, RecaptureJob):
        log.info("recapturing sketch %s", job.sketch)
        version = service.recapture(job.sketch, trigger=job.trigger)
        out.update({"sketch": job.sketch, "versions": [version.version], "latest_version": version.version,
                    "table_versions": dict(version.table_versions), "fragments": version.fragments})
    elif isinstance(job, RegisterJob):
        log.info("registering sketch %s on %s", job.name, ", ".join(job.on))
        record, version = service.create_sketch(job.name, job.sql, list(job.on), fragments=_count(job.fragments),
                                                bounds=list(job.bounds) or None, dialect=job.dialect or "spark",
                                                strategy=job.strategy or Strategy.LAZY, trigger=job.trigger)
        out.update({"sketch": record.name, "versions": [version.version], "latest_version": version.version,
                    "table_versions": dict(version.table_versions), "fragments": version.fragments,
                    "safety": record.safety})
    elif isinstance(job, RepartitionJob):
        out.update(_repartition(service, job))
    return out


def _repartition(service: SketchService, job: RepartitionJob) -> dict[str, Any]:
    """Each sketch's repartition (one's failure does not stop the others; the job fails at the end naming it)."""
    factor = float(job.factor) if job.factor is not None else factor_setting()
    done, failed = [], []
    for name in job.sketches:
        try:
            result = service.repartition(name, factor, apply=True, trigger=job.trigger).to_json()
            log.info("sketch %s: %s", name, f"version {result['version']} with new ranges" if result["version"]
                     else "ranges within the factor")
            done.append(result)
        except ImpError as e:
            log.warning("sketch %s: repartition failed: %s", name, scrub(first_line(e)))
            done.append({"sketch": name, "error": first_line(e)})
            failed.append(name)
    out: dict[str, Any] = {"sketches": done, "failed": failed}
    if failed:
        out.update(status="failed", error=f"repartition failed for {len(failed)} sketch(es): {', '.join(failed)}")
    return out


def _count(value: int | str | None) -> int | None:
    """A count of a parsed job (an integer; the fields also admit the text of DAG templates)."""
    return None if value is None else int(value)


def _result(result: MaintenanceResult) -> dict[str, Any]:
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


def _handle(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    job = job_from_args(args)
    if isinstance(job, (MaintainJob, MaintainGroupJob, MaintainAllJob)) and job.batch_size is not None:
        check_batch_size(_count(job.batch_size), "--batch-size")  # before the catalog is opened
    service = SketchService(settings_from(args, log.warning), progress=log.info)
    try:
        summary = run(service, job)
    finally:
        service.stop_spark()  # spark-submit then exits promptly
    summary["seconds"] = round(time.perf_counter() - started, 3)
    sys.stdout.write(scrub(json.dumps(summary, default=str)) + "\n")
    sys.stdout.flush()
    if summary["status"] == "failed":  # the summary above says which sketches; the error line lists them too
        raise GroupFailedError(summary["error"])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("imp-job", argv, job_parser, _handle, quiet_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
