"""Keyed checksums (HMAC-SHA256) that seal operator state in the catalog, and their key.

See docs/SECURITY.md, "Operator state integrity".
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets as _random
from pathlib import Path

from imp_core.errors import ConfigError
from imp_core.security.redact import register_secret
from imp_core.security.secrets import STATE_KEY_FILE, read_or_create, read_setting_file, secrets_dir

ENV_STATE_KEY_FILE = "IMP_STATE_KEY_FILE"
_DOMAIN = b"imp-operator-state-v1"


def load_state_key(home: Path, env: dict[str, str] | None = None) -> bytes:
    """The state key: ``IMP_STATE_KEY_FILE`` if set, else ``home/secrets/state.key`` (generated when missing).

    Raises:
        ConfigError: The key file is unreadable, readable by others, or shorter than 16 bytes of entropy.
    """
    env = dict(os.environ if env is None else env)
    if env.get(ENV_STATE_KEY_FILE):
        text = read_setting_file(env[ENV_STATE_KEY_FILE], ENV_STATE_KEY_FILE)
    else:
        text = read_or_create(secrets_dir(home) / STATE_KEY_FILE, _random.token_hex(32) + "\n").strip()
    if len(text) < 32:
        raise ConfigError(
            f"the state key must have at least 32 characters (e.g. `openssl rand -hex 32`), got {len(text)}"
        )
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
