"""Security helpers: the one redaction (``redact``), secret files (``secrets``), keyed state checksums (``integrity``).

docs/SECURITY.md has the threat model they serve.
"""

from __future__ import annotations
