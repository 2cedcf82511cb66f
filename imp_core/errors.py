"""The platform's one error hierarchy, with the exit code of each kind of error.

See docs/ARCHITECTURE.md, "Settings and errors".
"""

from __future__ import annotations


class ImpError(Exception):
    """Root of every error the platform raises on purpose."""

    exit_code = 1


class ConfigError(ImpError):
    """A setting (environment variable or flag) is missing or invalid."""

    exit_code = 2


class UsageError(ImpError):
    """A command was called with arguments that cannot work (bad flag values, unknown names)."""

    exit_code = 2


class PlanError(ImpError):
    """A query or plan is malformed: unknown table/column, ambiguous name, type mismatch.

    An error the SQL front-end raises about a place in the query text says where in its message (one line, for
    users) and in fields, for programs (as sqlglot's ``ParseError.errors``).

    Attributes:
        line: 1-based line of the query text the error is about; None when it is not about one place.
        column: 1-based column on that line: of the place's first character (for a parse error, sqlglot's
            position: the last character of the token where parsing stopped); None as ``line``.
        snippet: The SQL written at that place (shortened to 60 characters); None when not about SQL text.
    """

    exit_code = 3

    def __init__(
        self, message: str, *, line: int | None = None, column: int | None = None, snippet: str | None = None
    ) -> None:
        super().__init__(message)
        self.line = line
        self.column = column
        self.snippet = snippet


class UnsupportedError(PlanError):
    """A SQL construct or plan shape the platform does not support (rejected at registration)."""


class OrderDependentValueError(UnsupportedError):
    """The data made a value depend on the order in which Spark adds rows where the query uses it in a way the
    sketch cannot keep conservative (raised while capturing or maintaining; the sketch stays at its last version)."""


class UnsafeSketchError(PlanError):
    """The partition column is not safe for the query: a sketch on it could make the query wrong."""


class SourceError(ImpError):
    """A table source cannot deliver what was asked: not a Delta table, no CDF, version out of range."""

    exit_code = 4


class ChangeFeedUnavailableError(SourceError):
    """The change feed for a version range cannot be read (CDF disabled for a version, or vacuumed).

    Incremental maintenance cannot proceed; a recapture can.
    """


class StateError(ImpError):
    """Operator state is missing, corrupt, or written by an incompatible format version.

    Incremental maintenance cannot proceed; a recapture can.
    """

    exit_code = 5


class CatalogError(ImpError):
    """The sketch catalog cannot be reached, is at the wrong schema revision, or refused a write."""

    exit_code = 6


class NotFoundError(CatalogError):
    """A sketch, table or version named by the user does not exist in the catalog."""

    exit_code = 7


class ConcurrentMaintenanceError(CatalogError):
    """Another maintainer committed the version this run wanted to commit."""


class MaintainerBusyError(CatalogError):
    """Another process holds a sketch's maintenance lock longer than the caller is willing to wait."""


class BufferExhaustedError(StateError):
    """A bounded MIN/MAX or top-k buffer ran out under deletions; the sketch must be recaptured."""


class WholeStateChangedError(StateError):
    """A change reaches every row of an operator's state kept outside the process (a ``NOT IN`` whose subquery
    gained its first NULL or lost its last row): a recapture computes the new result instead of reading every stored
    row back into the process."""


class SketchUnusableError(ImpError):
    """A sketch can no longer be trusted: its safety or sign assumptions stopped holding, or a table it reads changed
    identity (re-registered elsewhere, re-created) or went back to an older version.

    The sketch is marked unusable in the catalog; queries run without it until it is dropped and created again.
    """

    exit_code = 8


class GroupFailedError(ImpError):
    """Some sketches of a grouped maintenance job failed; the others were maintained, and each failure is recorded
    as a failed run of its sketch."""

    exit_code = 9


def first_line(error: BaseException | str) -> str:
    """The first non-empty line of an error (or a message), for one-line reports.

    An ``ImpError``'s message is written for users and stands alone; any other exception gets its class name in front
    (``KeyError: 'x'``), since its message alone rarely says what went wrong.
    """
    if isinstance(error, str):
        text = error
    elif isinstance(error, ImpError):
        text = str(error)
    else:
        orig = getattr(error, "orig", None)  # SQLAlchemy wraps the driver's exception
        inner = orig if orig is not None else error
        text = f"{type(inner).__name__}: {inner}" if str(inner).strip() else type(inner).__name__
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else (type(error).__name__ if not isinstance(error, str) else "unknown error")
