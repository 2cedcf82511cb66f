"""Range partitions of tables and provenance sketches over them (paper Section 4.1).

See docs/ARCHITECTURE.md, "Annotated deltas" (fragment ids) and docs/SEMANTICS.md, "Partitions, bounds and file
statistics".
"""

from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch

__all__ = ["Partition", "PartitionSet", "Sketch"]
