"""The one redaction: URLs by parsing them, and every secret this process knows of, wherever it appears.

See docs/SECURITY.md, "Secrets in output, logs, pages and command lines".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

import sqlalchemy as sa

MASK = "***"
UNPARSEABLE = "<unparseable URL, not shown>"

# query parameters of a database URL whose value is a secret (libpq keywords and common driver spellings)
SECRET_QUERY_KEYS = frozenset({"password", "pass", "passwd", "pwd", "sslpassword", "secret", "token", "access_token",
                               "secret_key", "aws_secret_access_key", "session_token"})

_MIN_SECRET_LENGTH = 4  # shorter strings would mask ordinary words; generated secrets are far longer
_lock = threading.Lock()
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a secret so :func:`scrub` (and so every CLI/job log line and error) hides it from now on."""
    if not value or len(value) < _MIN_SECRET_LENGTH:
        return
    forms = {value, quote(value, safe=""), quote_plus(value)}
    with _lock:
        _secrets.update(f for f in forms if len(f) >= _MIN_SECRET_LENGTH)


def register_url(url: str | None) -> None:
    """Register the password and secret query parameters of a URL (see :func:`register_secret`)."""
    if not url:
        return
    for secret in url_secrets(url):
        register_secret(secret)


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries: its password and the values of secret query parameters."""
    parsed = _parse(url)
    if parsed is None:
        return []
    out = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if key.lower() in SECRET_QUERY_KEYS:
            out.extend([value] if isinstance(value, str) else list(value))
    return [str(s) for s in out if s]


def redact_url(url: str) -> str:
    """``url`` with its password and secret query parameters replaced by ``***``; unparseable input is not shown.

    Args:
        url: Any ``scheme://user:password@host/...?key=value`` URL (a SQLAlchemy URL, a libpq URL, ``s3://...``).

    Returns:
        The URL safe to print; :data:`UNPARSEABLE` when it cannot be parsed (it might be a secret itself).
    """
    parsed = _parse(url)
    if parsed is None:
        return UNPARSEABLE
    query = {k: (MASK if k.lower() in SECRET_QUERY_KEYS else v) for k, v in parsed.query.items()}
    shown = parsed.set(query=query).render_as_string(hide_password=True)
    return scrub(shown)


def scrub(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with every registered secret (and each of ``extra``) replaced by ``***``."""
    with _lock:
        known = set(_secrets)
    for secret in extra:
        if secret and len(secret) >= _MIN_SECRET_LENGTH:
            known.update({secret, quote(secret, safe=""), quote_plus(secret)})
    for secret in sorted(known, key=len, reverse=True):  # longest first: an encoded form may contain a plain one
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_urls(text: str, *urls: str | None) -> str:
    """``text`` with each URL replaced by its redacted form and every secret in them masked."""
    secrets: list[str] = []
    for url in urls:
        if not url:
            continue
        text = text.replace(url, redact_url(url))
        secrets.extend(url_secrets(url))
    return scrub(text, secrets)


class SecretFilter(logging.Filter):
    """A logging filter that scrubs registered secrets from each record's message (args merged first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logged as it is
            return True
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Attach :class:`SecretFilter` to every handler of ``logger`` (default: the root logger)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(SecretFilter())


def _parse(url: str) -> sa.URL | None:
    try:
        return sa.make_url(url)
    except Exception:  # noqa: BLE001 - ArgumentError, ValueError: anything unparseable is hidden
        return None


__all__ = ["MASK", "SecretFilter", "install_log_filter", "redact_url", "register_secret", "register_url", "scrub",
           "scrub_urls", "url_secrets"]
