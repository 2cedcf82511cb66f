"""Streams the code is known to get wrong, each run as ``xfail(strict=True)`` with its reason, so that a fix that
makes one pass fails the run until its entry goes. Empty: issue 53's fixes made every stream and reproduction pass.

``REGRESSION_SEEDS`` are random streams that once found a defect; they run in every CI run beside the first
``--diff-streams`` seeds."""

from __future__ import annotations

KNOWN_ON_MAIN: dict[int, str] = {}
"""Seed of a random stream -> why it fails."""

REPRODUCTIONS_ON_MAIN: dict[str, str] = {}
"""Name of an issue reproduction (``reproductions.py``) -> why it fails."""

REGRESSION_SEEDS: dict[int, str] = {
    6: "four rows of 6e37 in a DECIMAL(38, 0) SUM: every maintain job ended in a polars decimal overflow (issue 53, "
    "item 4)",
    111: "an aggregation kept in Delta tables whose input had no row at the capture saved a store without a Delta "
    "version, and the next job could not open it (int(None))",
    168: "a NOT IN over a float HAVING blocked left rows with a subquery row the conservative HAVING kept at its "
    "threshold (sum 1.5 > 1.5 is false in Spark): the sketch lacked two groups in every mode and through the rule",
    249: "a MAX over a date grouped by a float key, kept in Delta tables: the capture's value counts carried the "
    "key's NaN flag last and the multiset's fold could not stack them (ShapeError at create)",
    335: "state kept in Delta tables sorted by a TIMESTAMP_NTZ key: writing it cast the key to BIGINT for a span only "
    "integer and date keys have (AnalysisException at create)",
}
"""Seed of a random stream that found a defect -> the defect."""
