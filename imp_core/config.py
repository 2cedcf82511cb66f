"""The one place where settings are read: each ``IMP_`` environment variable, its CLI flag and its default.

See docs/ARCHITECTURE.md, "Settings and errors".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from imp_core.errors import ConfigError
from imp_core.security.redact import redact_url, register_url
from imp_core.security.secrets import read_setting_file

ENV_HOME = "IMP_HOME"
ENV_CATALOG_URL = "IMP_CATALOG_URL"
ENV_WAREHOUSE = "IMP_WAREHOUSE"
ENV_SPARK_MASTER = "IMP_SPARK_MASTER"
ENV_SHUFFLE_PARTITIONS = "IMP_SHUFFLE_PARTITIONS"
ENV_STATE_RETENTION = "IMP_STATE_RETENTION"
ENV_PUBLISH_LOCATION = "IMP_PUBLISH_LOCATION"
ENV_OPTIMIZATIONS = "IMP_OPTIMIZATIONS"
ENV_CATALOG_URL_FILE = "IMP_CATALOG_URL_FILE"
ENV_MAX_FRAGMENTS = "IMP_MAX_FRAGMENTS"
ENV_QUERY_WAIT = "IMP_QUERY_WAIT"
ENV_STATE_BUDGET = "IMP_STATE_MEMORY_BUDGET"
ENV_STATE_LOCATION = "IMP_STATE_LOCATION"
ENV_COST_CHOICE = "IMP_RECAPTURE_BY_COST"
ENV_ON_COMMIT = "IMP_ON_COMMIT"
ENV_WATCH_INTERVAL = "IMP_WATCH_INTERVAL"
ENV_ON_COMMIT_BATCH_SIZE = "IMP_ON_COMMIT_BATCH_SIZE"
ENV_CATALOG_NAME = "IMP_CATALOG_NAME"
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
               "t": 1 << 40, "tb": 1 << 40}


@dataclass(frozen=True)
class Optimizations:
    """Switches for the maintenance optimizations (all on by default once measured to help).

    ``IMP_OPTIMIZATIONS`` takes a comma list such as ``-bloom,-netting`` to switch some off, or ``none``.
    """

    selection_pushdown: bool = True
    join_key_pushdown: bool = True
    bloom_filters: bool = True
    netting: bool = True
    small_side_in_memory: bool = True
    partner_index: bool = True
    # top-k state as head + rest log (off: every row re-sorted per batch, for comparison). Not a state option
    # (imp_core.maintenance.options): either layout loads into either operator.
    topk_index: bool = True
    # aggregation state keyed by group and updated in place (off: whole frames rewritten per batch, for comparison);
    # not a state option either: the saved frames are the same.
    agg_index: bool = True
    # join partner indexes keyed by join key (off: the first engine's frames, rewritten per batch); same saved frames
    join_index: bool = True
    # bounded buffers (paper 7.2); with them, changes beyond a buffer's bound are dropped before any state update
    # (aggregate selection, Liu et al.). 0 keeps every input row / value (the paper's 5.2.6-5.2.7 state).
    topk_buffer: int = 0
    minmax_buffer: int = 0
    small_side_rows: int = 100_000
    partner_rows: int = 1_000_000  # largest partner index (rows of a large join side that can join) kept in state
    # largest join side (rows of the tables it reads, from their Delta logs) a join cache is built for: building one
    # evaluates the side whole, which beyond this costs more than many per-delta Spark joins with key push-down
    side_cache_rows: int = 10_000_000

    @classmethod
    def parse(cls, text: str | None) -> Optimizations:
        opts = cls()
        if not text:
            return opts
        names = {
            "pushdown": "selection_pushdown",
            "keys": "join_key_pushdown",
            "bloom": "bloom_filters",
            "netting": "netting",
            "smallside": "small_side_in_memory",
            "partners": "partner_index",
            "topkindex": "topk_index",
            "aggindex": "agg_index",
            "joinindex": "join_index",
        }
        if text.strip() == "none":
            return replace(opts, **{v: False for v in names.values()})
        changes: dict[str, object] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            if "=" in part:
                key, _, value = part.partition("=")
                if key not in ("topk_buffer", "minmax_buffer", "small_side_rows", "partner_rows", "side_cache_rows"):
                    raise ConfigError(f"{ENV_OPTIMIZATIONS}: unknown setting {key!r}; use topk_buffer=N, "
                                      f"minmax_buffer=N, small_side_rows=N, partner_rows=N or side_cache_rows=N")
                try:
                    changes[key] = int(value)
                except ValueError as e:
                    raise ConfigError(f"{ENV_OPTIMIZATIONS}: {key} must be an integer, got {value!r}") from e
                continue
            on = not part.startswith("-")
            name = part.lstrip("+-")
            if name not in names:
                raise ConfigError(f"{ENV_OPTIMIZATIONS}: unknown optimization {name!r}; known: "
                                  f"{', '.join(sorted(names))}")
            changes[names[name]] = on
        return replace(opts, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Settings:
    """Resolved settings for one process."""

    home: Path
    catalog_url: str | None = None
    warehouse: Path | None = None
    spark_master: str = "local[*]"
    shuffle_partitions: int = 8
    state_retention: int = 5
    optimizations: Optimizations = field(default_factory=Optimizations)
    # most fragments a partition may have (--fragments, --bounds): bounds, sketches and state grow with it
    max_fragments: int = 10_000
    # seconds `imp query` / the Python API wait for another maintainer of a stale sketch before running without it
    query_wait: float = 10.0
    # bytes of operator state one sketch may hold in the maintaining process; larger state goes to Delta tables
    # (None: a quarter of this machine's memory)
    state_budget: int | None = None
    # where external state lives (a local path or s3:// URI); None: `_imp_state` beside the sketch's first table
    state_location: str | None = None
    # whether a pass whose estimated cost exceeds a recapture's recaptures instead (the paper's break-even)
    cost_choice: bool = True
    # where sketch manifests are published for imp's Spark extension (a local path or s3:// URI); None:
    # `_imp_sketches` beside the sketch's first table, where the extension looks by default
    publish_location: str | None = None

    @property
    def memory_budget(self) -> int:
        """The state budget in bytes (the setting, else a quarter of physical memory)."""
        if self.state_budget is not None:
            return self.state_budget
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4)
        except (ValueError, OSError, AttributeError):
            return 2 << 30

    @property
    def warehouse_path(self) -> Path:
        return self.warehouse if self.warehouse is not None else self.home / "warehouse"

    @property
    def embedded_pgdata(self) -> Path:
        return self.home / "pgdata"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: object) -> Settings:
        """Read ``IMP_*`` variables, then apply non-None ``overrides`` (CLI flags win over the environment)."""
        env = dict(os.environ if env is None else env)
        home = Path(env.get(ENV_HOME) or Path.home() / ".imp").expanduser()
        warehouse = env.get(ENV_WAREHOUSE)
        values: dict[str, object] = {
            "home": home,
            "catalog_url": env.get(ENV_CATALOG_URL) or _catalog_url_file(env),
            "warehouse": Path(warehouse).expanduser() if warehouse else None,
            "spark_master": env.get(ENV_SPARK_MASTER) or "local[*]",
            "shuffle_partitions": _int(env, ENV_SHUFFLE_PARTITIONS, 8),
            "state_retention": _int(env, ENV_STATE_RETENTION, 5),
            "optimizations": Optimizations.parse(env.get(ENV_OPTIMIZATIONS)),
            "max_fragments": _int(env, ENV_MAX_FRAGMENTS, 10_000),
            "query_wait": _float(env, ENV_QUERY_WAIT, 10.0),
            "state_budget": _size(env, ENV_STATE_BUDGET),
            "state_location": env.get(ENV_STATE_LOCATION) or None,
            "cost_choice": _switch(env, ENV_COST_CHOICE, True),
            "publish_location": env.get(ENV_PUBLISH_LOCATION) or None,
        }
        for key, value in overrides.items():
            if value is None:
                continue
            if key in ("home", "warehouse"):
                value = Path(str(value)).expanduser()
            values[key] = value
        settings = cls(**values)  # type: ignore[arg-type]
        if settings.state_retention < 1:
            raise ConfigError(f"{ENV_STATE_RETENTION} must be at least 1 (keep state of the latest version), "
                              f"got {settings.state_retention}")
        if settings.max_fragments < 1:
            raise ConfigError(f"{ENV_MAX_FRAGMENTS} must be at least 1, got {settings.max_fragments}")
        if settings.query_wait < 0:
            raise ConfigError(f"{ENV_QUERY_WAIT} must be 0 or more seconds, got {settings.query_wait}")
        register_url(settings.catalog_url)
        return settings


@dataclass(frozen=True)
class WatchSettings:
    """Maintenance on commit under Airflow: the Delta-log watch of the registered tables and the DAG it triggers
    (docs/AIRFLOW.md, "Maintenance on commit")."""

    # IMP_ON_COMMIT: off leaves the table assets without watchers (nothing polls; the DAG still runs on table
    # asset events that something else records)
    enabled: bool = True
    # IMP_WATCH_INTERVAL: seconds between two reads of a table's Delta log (one stat, or one S3 LIST, per table)
    poll_seconds: float = 5.0
    # IMP_ON_COMMIT_BATCH_SIZE: eager maintenance commits one sketch version per batch of this many change rows
    batch_size: int = 1000
    # IMP_CATALOG_NAME: the authority of the sketches' asset URIs, imp://<catalog>/<sketch>
    catalog_name: str = "imp"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WatchSettings:
        env = dict(os.environ if env is None else env)
        settings = cls(enabled=_switch(env, ENV_ON_COMMIT, True), poll_seconds=_float(env, ENV_WATCH_INTERVAL, 5.0),
                       batch_size=_int(env, ENV_ON_COMMIT_BATCH_SIZE, 1000),
                       catalog_name=(env.get(ENV_CATALOG_NAME) or "imp").strip())
        if not 0.1 <= settings.poll_seconds <= 3600:
            raise ConfigError(f"{ENV_WATCH_INTERVAL} must be between 0.1 and 3600 seconds, got {settings.poll_seconds}")
        if settings.batch_size < 1:
            raise ConfigError(f"{ENV_ON_COMMIT_BATCH_SIZE} must be at least 1 (change rows per committed version), "
                              f"got {settings.batch_size}")
        if not _CATALOG_NAME.fullmatch(settings.catalog_name):
            raise ConfigError(f"{ENV_CATALOG_NAME} must be letters, digits, '.' and '-' (a URI host such as "
                              f"prod-imp), got {settings.catalog_name!r}")
        return settings


_CATALOG_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,62}[A-Za-z0-9])?")


def _int(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as e:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from e


def _float(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as e:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from e


def _size(env: dict[str, str], name: str) -> int | None:
    """A size such as ``512m``, ``2g`` or ``0`` (bytes without a unit); None when unset."""
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return None
    number = raw.rstrip("bkmgt")
    unit = raw[len(number):]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError) as e:
        raise ConfigError(f"{name} must be a size such as 512m, 4g or 0, got {raw!r}") from e
    if value < 0:
        raise ConfigError(f"{name} must be 0 or more, got {raw!r}")
    return int(value)


def _switch(env: dict[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in ("on", "off"):
        raise ConfigError(f"{name} must be on or off, got {raw!r}")
    return raw == "on"


def _catalog_url_file(env: dict[str, str]) -> str | None:
    """The catalog URL from the private file named by ``IMP_CATALOG_URL_FILE`` (how spark-submit jobs get it)."""
    path = env.get(ENV_CATALOG_URL_FILE)
    if not path:
        return None
    return read_setting_file(path, ENV_CATALOG_URL_FILE)


__all__ = ["Optimizations", "Settings", "WatchSettings", "redact_url"]
