"""The backend contract's optional capabilities are protocols a pass checks with ``isinstance``: the Spark backend
declares each of them, the in-process backend none that reads stores, and a backend with only some of a
capability's methods does not have it."""

from __future__ import annotations

from typing import Any

from imp_core.engine.backend import GroupCountingBackend, JoinCacheBackend, StoreReadingBackend
from imp_core.engine.local import LocalBackend


def test_the_spark_backend_declares_every_optional_capability() -> None:
    from imp_core.spark.backend import SparkBackend

    for capability in (StoreReadingBackend, GroupCountingBackend, JoinCacheBackend):
        assert issubclass(SparkBackend, capability), capability.__name__


def test_the_in_process_backend_reads_no_store_and_counts_no_groups() -> None:
    assert not issubclass(LocalBackend, StoreReadingBackend)
    assert not issubclass(LocalBackend, GroupCountingBackend)


def test_some_of_a_capabilitys_methods_are_not_the_capability() -> None:
    class ReadsOnly:
        def reads_external(self, rel: Any) -> bool:
            return True

        def reads_external_side(self, rel: Any) -> bool:
            return True

    assert not isinstance(ReadsOnly(), StoreReadingBackend)
