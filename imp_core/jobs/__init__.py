"""Job entry points that ``spark-submit`` runs (the Airflow DAGs submit them).

``SUBMIT_PATH`` is the file to hand to ``spark-submit`` (``SparkSubmitOperator(application=jobs.SUBMIT_PATH)``)::

    spark-submit --master local[*] $(python -c 'import imp_core.jobs as j; print(j.SUBMIT_PATH)') \\
        maintain --sketch top --strategy eager --batch-size 1000 --trigger airflow:imp_nightly_maintenance/RUN

This module stays import-light: DAG files import it while the DAG processor parses them.
"""

from __future__ import annotations

from pathlib import Path

SUBMIT_PATH: str = str(Path(__file__).resolve().with_name("submit.py"))
"""Absolute path of the ``spark-submit`` application (``imp_core/jobs/submit.py``)."""

COMMANDS = ("maintain", "maintain-all", "recapture", "register")
"""Subcommands of :data:`SUBMIT_PATH`."""

__all__ = ["COMMANDS", "SUBMIT_PATH"]
