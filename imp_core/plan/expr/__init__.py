"""Scalar and aggregate expressions of the plan IR, typed with Spark's rules.

``types`` holds the typing rules on Arrow types, ``operators`` the expression base class, columns, constants and
operators, ``calls`` functions, EXTRACT and aggregates, ``rewrite`` rewrites of expressions, ``visitors`` the node
list every compiler must cover; this package re-exports the public names of all five. See docs/ARCHITECTURE.md,
"The plan IR".
"""

from imp_core.plan.expr import calls, operators, rewrite, types, visitors
from imp_core.plan.expr.calls import *  # noqa: F403
from imp_core.plan.expr.operators import *  # noqa: F403
from imp_core.plan.expr.rewrite import *  # noqa: F403
from imp_core.plan.expr.types import *  # noqa: F403
from imp_core.plan.expr.visitors import *  # noqa: F403

__all__ = [*types.__all__, *operators.__all__, *calls.__all__, *rewrite.__all__, *visitors.__all__]
