"""Named crash points for the kill tests: with ``IMP_FAULT=<point>`` the process kills itself (SIGKILL) there.

A SIGKILL cannot be caught, so this is exactly what a crashed worker or an OOM kill looks like to the catalog. The
points sit where a half-written result would be most likely: after the change feed is read, after the engine ran,
before the commit, and inside the commit transaction after the version row is written.
"""

from __future__ import annotations

import os
import signal

POINTS = ("after_cdf_read", "after_pass", "before_commit", "in_commit")


def point(name: str) -> None:
    if os.environ.get("IMP_FAULT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
