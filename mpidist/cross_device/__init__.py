"""Cross-device layer: CrossDeviceOps family, ReduceOp, communication options."""
from .ops import (
                  CrossDeviceOps,
                  HierarchicalCopyAllReduce,
                  MPIAllReduce,
                  NcclAllReduce,
                  ReductionToOneDevice,
                  local_value,
)
from .options import (
                  CollectiveCommunication,
                  CollectiveHints,
                  CommunicationImplementation,
                  CommunicationOptions,
                  as_options,
                  call_options_of,
                  hints_and_options,
)
from .reduce_op import ReduceOp, as_reduce_op

__all__ = ["CrossDeviceOps", "HierarchicalCopyAllReduce", "MPIAllReduce", "NcclAllReduce",
           "ReductionToOneDevice", "local_value", "CollectiveCommunication", "CollectiveHints",
           "CommunicationImplementation", "CommunicationOptions", "as_options", "call_options_of", "hints_and_options",
           "ReduceOp", "as_reduce_op"]
