"""What a finished job committed, told to Airflow and to OpenLineage: the tables it read at which versions and the
sketch versions it made.

:func:`job_lineage` reads it back from the catalog's runs (the job's trigger, ``airflow:<dag>/<run>``, names them),
so it holds for every try of a task. The operators then

* :func:`announce` the sketches as the task's outlets: each committed sketch's asset (``imp://<catalog>/<sketch>``)
  gets one asset event whose extra is ``{"sketch", "version", "versions", "table_versions", "table_versions_from",
  "method", "delta_rows", "trigger"}``; declared sketch outlets the job did not commit get none;
* return :meth:`JobLineage.to_openlineage` from ``get_openlineage_facets_on_complete``: inputs are the tables at
  their versions (the ``version`` facet), outputs the sketches at theirs. OpenLineage's own naming: a local table is
  namespace ``file`` and its absolute path, an ``s3://`` table namespace ``s3://<bucket>`` and its key, a sketch
  namespace ``imp://<catalog>`` and its name.

Nothing here carries a secret: locations are registered paths (``s3://`` URIs hold no credentials), and every text
goes through the redaction. See docs/AIRFLOW.md, "Lineage".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import Asset

try:  # the OpenLineage provider is optional: its listener is what calls the lineage methods
    from airflow.providers.common.compat.openlineage.facet import InputDataset, OutputDataset
    from airflow.providers.openlineage.conf import is_disabled
    from airflow.providers.openlineage.extractors.base import OperatorLineage
    from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
except ImportError:
    OperatorLineage = None  # type: ignore[misc,assignment]

from imp_core.airflow.assets import SCHEME, catalog_name, sketch_asset, sketch_of_uri, table_uri
from imp_core.airflow.hooks import ImpCatalogHook
from imp_core.errors import ImpError, first_line
from imp_core.jobs import MaintainGroupJob, MaintainJob, RecaptureJob, RegisterJob, RepartitionJob, parse_job
from imp_core.security.redact import scrub
from imp_core.sources import storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SketchCommit:
    """The versions one job committed for one sketch, and the table versions they went from and to."""

    sketch: str
    version: int
    versions: tuple[int, ...]
    method: str
    table_versions: dict[str, int]
    table_versions_from: dict[str, int]
    delta_rows: int

    def asset_extra(self, trigger: str) -> dict[str, Any]:
        """The extra of the sketch asset's event."""
        return {"sketch": self.sketch, "version": self.version, "versions": list(self.versions),
                "table_versions": dict(self.table_versions), "table_versions_from": dict(self.table_versions_from),
                "method": self.method, "delta_rows": self.delta_rows, "trigger": trigger}


@dataclass(frozen=True)
class JobLineage:
    """What one job (its trigger and sketches) committed, with the locations of the tables it read."""

    trigger: str
    commits: tuple[SketchCommit, ...] = ()
    locations: dict[str, str] = field(default_factory=dict)  # table name -> registered location
    catalog: str = "imp"
    registration: bool = False  # a new sketch's capture: lineage, but no asset event (nothing was refreshed)

    def inputs(self) -> list[tuple[str, str, int]]:
        """``(namespace, name, version)`` of each table read, at the newest version a sketch reached."""
        reached: dict[str, int] = {}
        for c in self.commits:
            for table, version in c.table_versions.items():
                reached[table] = max(version, reached.get(table, version))
        return [(*dataset_name(table_uri(self.locations[t]) if t in self.locations else t), v)
                for t, v in sorted(reached.items())]

    def outputs(self) -> list[tuple[str, str, int]]:
        """``(namespace, name, version)`` of each sketch committed."""
        return [(f"{SCHEME}://{self.catalog}", c.sketch, c.version) for c in self.commits]

    def to_openlineage(self) -> Any:
        """An OpenLineage ``OperatorLineage`` (the provider installed: only its listener calls this)."""
        def facets(version: int) -> dict[str, Any]:
            return {"version": DatasetVersionDatasetFacet(datasetVersion=str(version))}

        return OperatorLineage(
            inputs=[InputDataset(namespace=ns, name=name, facets=facets(v)) for ns, name, v in self.inputs()],
            outputs=[OutputDataset(namespace=ns, name=name, facets=facets(v)) for ns, name, v in self.outputs()])


def dataset_name(uri: str) -> tuple[str, str]:
    """OpenLineage's ``(namespace, name)`` of a table location or asset URI."""
    if uri.startswith("file://") or "://" not in uri:
        return "file", urlsplit(uri).path if uri.startswith("file://") else uri
    parts = urlsplit(storage.redact(uri))
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


def job_sketches(application_args: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    """``(trigger, sketches)`` of a job that commits sketch versions; None for other argv."""
    try:
        job = parse_job(application_args)
    except (ImpError, SystemExit):
        return None
    if isinstance(job, (MaintainJob, RecaptureJob)):
        return job.trigger, (job.sketch,)
    if isinstance(job, (MaintainGroupJob, RepartitionJob)):
        return job.trigger, tuple(job.sketches)
    if isinstance(job, RegisterJob):
        return job.trigger, (job.name,)
    return None


def job_lineage(application_args: Sequence[str], conn_id: str) -> JobLineage | None:
    """What the job of ``application_args`` committed, read back from the catalog (None: not a sketch job, or the
    catalog could not say; logged)."""
    found = job_sketches(application_args)
    if found is None:
        return None
    trigger, sketches = found
    registration = application_args[0] == RegisterJob.COMMAND
    try:
        catalog = ImpCatalogHook(conn_id).get_conn(shared=True).catalog  # the one report_job opened
        commits = [c for name in dict.fromkeys(sketches) if (c := _commit(catalog, name, trigger)) is not None]
        locations = {t.name: t.path for t in catalog.list_tables()}
    except ImpError as e:
        log.warning("cannot read what this job committed back from the catalog: %s", scrub(first_line(e)))
        return None
    return JobLineage(trigger, tuple(commits), locations, catalog_name(), registration)


def _commit(catalog: Any, name: str, trigger: str) -> SketchCommit | None:
    """The versions ``trigger``'s runs committed for sketch ``name`` (None: none)."""
    try:
        record = catalog.get_sketch(name)
    except ImpError:
        return None
    runs = [r for r in catalog.runs(record.id, limit=200)
            if r.trigger == trigger and r.status == "succeeded" and r.to_version is not None]
    made = sorted({v for r in runs for v in range((r.from_version or 0) + 1, r.to_version + 1)})
    if not made:
        return None
    first = min(runs, key=lambda r: r.id)
    version = catalog.get_version(record.id, max(made))
    return SketchCommit(name, version.version, tuple(made), version.method, dict(version.table_versions),
                        dict(first.table_versions_from or {}), sum(r.delta_rows or 0 for r in runs))


def announce(task: Any, context: Mapping[str, Any], lineage: JobLineage | None) -> None:
    """Make the committed sketches the task's outlets, each with its event's extra (other outlets stay)."""
    if lineage is None or lineage.registration:
        return
    kept = [o for o in task.outlets or () if not (isinstance(o, Asset) and sketch_of_uri(o.uri))]
    committed = [sketch_asset(c.sketch, lineage.catalog) for c in lineage.commits]
    task.outlets = kept + committed
    events = context.get("outlet_events")
    for asset, commit in zip(committed, lineage.commits):
        if events is not None:
            events[asset].extra = commit.asset_extra(lineage.trigger)
        log.info("sketch %s: version %d (%s) at table versions %s: announced as asset %s", commit.sketch,
                 commit.version, commit.method, commit.table_versions, asset.uri)


def openlineage_enabled() -> bool:
    """Whether Airflow's OpenLineage provider is installed and configured (a transport, or a config file)."""
    return OperatorLineage is not None and not is_disabled()


__all__ = ["JobLineage", "SketchCommit", "announce", "dataset_name", "job_lineage", "job_sketches",
           "openlineage_enabled"]
