"""Cross-device layer: the CrossDeviceOps base (the public classes are in mpidist/cross_device_ops.py),
ReduceOp, communication options."""
from .ops import CrossDeviceOps, local_value, reduction_to_root, root_of
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

__all__ = ["CrossDeviceOps", "local_value", "reduction_to_root", "root_of", "CollectiveCommunication",
           "CollectiveHints", "CommunicationImplementation", "CommunicationOptions", "as_options", "call_options_of",
           "hints_and_options", "ReduceOp", "as_reduce_op"]
