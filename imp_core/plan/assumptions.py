"""Sign assumptions: the column signs a safety verdict relies on, stored with the sketch and re-checked against the
data (docs/SAFETY.md, "Sign assumptions")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from imp_core.errors import PlanError


@dataclass(frozen=True, slots=True)
class SignAssumption:
    """A column sign a safety verdict relies on: ``table.column >= 0`` (sign ``+``) or ``<= 0`` (sign ``-``).

    Its text (``str``) is its JSON form in the catalog; :meth:`parse` reads it back.
    """

    table: str
    column: str
    sign: str

    def __post_init__(self) -> None:
        if self.sign not in ("+", "-"):
            raise PlanError(f"a sign assumption's sign is + or -, not {self.sign!r}")

    @property
    def op(self) -> str:
        """The comparison with 0 that must hold: ``>=`` or ``<=``."""
        return ">=" if self.sign == "+" else "<="

    def __str__(self) -> str:
        return f"{self.table}.{self.column} {self.op} 0"

    @classmethod
    def parse(cls, text: str) -> SignAssumption:
        """The assumption written as ``TABLE.COLUMN >= 0`` or ``TABLE.COLUMN <= 0`` (a column name may hold spaces).

        Raises:
            PlanError: ``text`` is not of that form.
        """
        m = _ASSUMPTION.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise PlanError(f"stored sign assumption {text!r} is not TABLE.COLUMN >= 0 or TABLE.COLUMN <= 0")
        return cls(m["table"], m["column"], "+" if m["op"] == ">=" else "-")


_ASSUMPTION = re.compile(r"(?P<table>[^.]+)\.(?P<column>.+) (?P<op>>=|<=) 0")


__all__ = ["SignAssumption"]
