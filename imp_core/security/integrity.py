"""Keyed checksums for operator state: HMAC-SHA256 with a key kept outside the catalog.

A plain SHA-256 stored next to the state catches corruption but not forgery: anyone who can write the catalog can
write new state and its digest. The seal is an HMAC over the sketch name, the version, the operator id and the
payload, so state cannot be forged without the key, nor moved to another sketch, version or operator. A state that
does not verify is a ``StateError``, which makes maintenance recapture the sketch (recorded with the reason).

The key: the file named by ``IMP_STATE_KEY_FILE`` (one key shared by every host that maintains sketches in one
catalog: Airflow workers, spark-submit drivers, CLI users), else ``IMP_HOME/secrets/state.key``, generated on first
use. Hosts with different keys do not corrupt anything, they recapture each other's state; docs/SECURITY.md says
to share one key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets as _random
from pathlib import Path

from imp_core.errors import ConfigError

ENV_STATE_KEY_FILE = "IMP_STATE_KEY_FILE"
_DOMAIN = b"imp-operator-state-v1"


def load_state_key(home: Path, env: dict[str, str] | None = None) -> bytes:
    """The state key: ``IMP_STATE_KEY_FILE`` if set, else ``home/secrets/state.key`` (generated when missing).

    Raises:
        ConfigError: The key file is unreadable, readable by others, or shorter than 16 bytes of entropy.
    """
    from imp_core.security.redact import register_secret
    from imp_core.security.secrets import STATE_KEY_FILE, read_or_create, read_setting_file, secrets_dir

    env = dict(os.environ if env is None else env)
    if env.get(ENV_STATE_KEY_FILE):
        text = read_setting_file(env[ENV_STATE_KEY_FILE], ENV_STATE_KEY_FILE)
    else:
        text = read_or_create(secrets_dir(home) / STATE_KEY_FILE, _random.token_hex(32) + "\n").strip()
    if len(text) < 32:
        raise ConfigError(f"the state key must have at least 32 characters (e.g. `openssl rand -hex 32`), got "
                          f"{len(text)}")
    register_secret(text)
    return hashlib.sha256(_DOMAIN + text.encode()).digest()


def seal(key: bytes, sketch: str, version: int, operator_id: str, payload: bytes) -> str:
    """The keyed checksum (64 hex digits) of one operator's state for one sketch version."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in (sketch.encode(), str(version).encode(), operator_id.encode()):
        mac.update(len(part).to_bytes(4, "big") + part)
    mac.update(payload)
    return mac.hexdigest()


def verify(key: bytes, sketch: str, version: int, operator_id: str, payload: bytes, stored: str) -> bool:
    """Whether ``stored`` is the seal of this state (constant-time comparison)."""
    return hmac.compare_digest(seal(key, sketch, version, operator_id, payload), stored or "")


__all__ = ["ENV_STATE_KEY_FILE", "load_state_key", "seal", "verify"]
