"""The maintenance strategies (IMP paper Sections 2 and 8.5): lazy, eager, recapture.

Import-light: DAG files read the choices while the DAG processor parses them. See docs/ARCHITECTURE.md, "Data flow".
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from imp_core.errors import UsageError


class Strategy(StrEnum):
    """How a sketch is brought to the current table versions."""

    LAZY = "lazy"
    """In one step, when it is needed."""
    EAGER = "eager"
    """Pending table versions in commit order, one sketch version per batch of change rows."""
    RECAPTURE = "recapture"
    """Full maintenance: capture again at the current versions."""

    @classmethod
    def choices(cls, *, default_only: bool = False) -> list[str]:
        """The strategies' names; ``default_only``: those a sketch may have as its default (not recapture)."""
        return [s.value for s in cls if not default_only or s is not cls.RECAPTURE]

    @classmethod
    def parse(cls, value: Any, *, default_only: bool = False) -> Strategy:
        """``value`` as a strategy.

        Raises:
            UsageError: ``value`` names no strategy (or, with ``default_only``, names recapture).
        """
        allowed = cls.choices(default_only=default_only)
        if not isinstance(value, str) or value not in allowed:
            raise UsageError(f"strategy must be one of {', '.join(allowed)}, got {value!r}")
        return cls(value)


__all__ = ["Strategy"]
