"""Security helpers shared by the whole platform: redaction, secret files under ``IMP_HOME``, integrity keys.

* :mod:`imp_core.security.redact`: the one redaction of URLs and known secrets, used by every log line, error
  message, CLI output and the Airflow page;
* :mod:`imp_core.security.secrets`: secret files (0600, in a 0700 directory owned by the process's user) under
  ``IMP_HOME``: the embedded catalog's password file and the state integrity key, plus ``*_FILE`` settings;
* :mod:`imp_core.security.integrity`: the keyed checksum (HMAC-SHA256) that seals operator state in the catalog.

docs/SECURITY.md has the threat model these serve.
"""

from __future__ import annotations
