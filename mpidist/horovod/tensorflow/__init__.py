"""Horovod's TensorFlow API on mpidist: ``import mpidist.horovod.tensorflow as hvd``.

Pure Python on mpidist's engine; launch with mpirun/srun as before. This module only re-exports.
See docs/horovod.md for what is supported and how it differs.
"""
from . import elastic, util
from .allreduce import allreduce, grouped_allreduce
from .basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .gather import allgather, alltoall, broadcast, grouped_allgather
from .hooks import BroadcastGlobalVariablesHook
from .objects import allgather_object, broadcast_object, broadcast_object_fn
from .ops_tensors import (
    cross_rank_op,
    cross_size_op,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from .optimizer import DistributedOptimizer
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .reduce_ops import Adasum, Average, Max, Min, Product, Sum, handle_average_backwards_compatibility
from .reducescatter import grouped_reducescatter, reducescatter
from .sync import barrier, broadcast_, broadcast_global_variables, broadcast_variables, join
from .tape import DistributedGradientTape, PartialDistributedGradientTape
from .util import executing_eagerly as _executing_eagerly  # noqa: F401 -- Horovod's tests call hvd._executing_eagerly()


def __getattr__(name: str) -> object:
    """``SyncBatchNormalization`` imports Keras, so only when it is asked for: the layer of
    ``tf.keras``'s Keras, as Horovod's (Keras 2 under TF_USE_LEGACY_KERAS=1, else Keras 3)."""
    if name == "SyncBatchNormalization":
        from ...tensorflow.keras import flavor
        if flavor.is_keras2():
            from .keras2_sync_batch_norm import SyncBatchNormalization as Keras2Layer
            return Keras2Layer
        from .sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline", "stop_timeline",
    "size_op", "rank_op", "process_set_included_op", "local_size_op", "local_rank_op", "cross_size_op", "cross_rank_op",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "handle_average_backwards_compatibility",
    "Compression", "Compressor", "NoneCompressor", "FP16Compressor",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
    "reducescatter", "grouped_reducescatter", "join", "barrier", "broadcast_variables", "broadcast_global_variables",
    "broadcast_",
    "broadcast_object", "broadcast_object_fn", "allgather_object",
    "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer", "SyncBatchNormalization",
    "BroadcastGlobalVariablesHook",
    "elastic", "util",
]
