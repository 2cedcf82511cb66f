"""Range partitions of tables and provenance sketches over them (paper Section 4.1)."""

from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch

__all__ = ["Partition", "PartitionSet", "Sketch"]
