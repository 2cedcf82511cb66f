"""The service's context under its former name, for the modules other branches are changing (``service.py``,
``sketch_use.py``, ``cost.py``, ``maintain.py``, ``use/extension.py``, ``tests/maintenance/test_cost.py``): each
imports :mod:`imp_core.maintenance.context` with that change, and this module goes."""

from __future__ import annotations

from imp_core.maintenance.context import Progress
from imp_core.maintenance.context import ServiceContext as Parts

__all__ = ["Parts", "Progress"]
