"""Horovod's Keras API on mpidist: ``import mpidist.horovod.tensorflow.keras as hvd``.

For the Keras of ``tf.keras``, as Horovod: Keras 3, or Keras 2 (tf_keras) when
``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported. The basics and collectives are
those of ``mpidist.horovod.tensorflow``; ``DistributedOptimizer`` takes Horovod's Keras signature
and a Keras 3 or Keras 2 optimizer (tf_keras's current or legacy ones); ``callbacks`` holds the
Keras callbacks; ``elastic`` Horovod's elastic Keras names; ``load_model`` loads a Keras model and
makes its optimizer distributed, keeping its state.
"""
from __future__ import annotations

from typing import Any

from ....tensorflow.keras import flavor
from .. import (  # noqa: F401
    Adasum,
    Average,
    Compression,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    SyncBatchNormalization,  # the layer of tf.keras's Keras
    add_process_set,
    allgather_object,
    alltoall,
    barrier,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
    cross_rank,
    cross_size,
    cuda_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from .. import allgather as _allgather
from .. import allreduce as _allreduce
from .. import broadcast as _broadcast
from .. import optimizer as _optimizer
from .. import reducescatter as _reducescatter
from . import callbacks, elastic


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, op: Any = Average,
                         backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """A Keras optimizer that allreduces gradients before applying them (Horovod's Keras signature)."""
    if not _optimizer.is_keras_optimizer(optimizer):
        raise TypeError(f"DistributedOptimizer: `optimizer` must be a Keras optimizer (Keras 3, or Keras 2 from "
                        f"tf_keras), got {type(optimizer).__name__}")
    return _optimizer.DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)


def PartialDistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                                device_sparse: str = "", compression: Any = Compression.none,
                                sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                                op: Any = Average, backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, groups: Any = None,
                                process_set: ProcessSet = global_process_set, local_layers: Any = None,
                                scale_local_gradients: bool = True) -> Any:
    """DistributedOptimizer that leaves the gradients of ``local_layers``' variables on this rank
    (divided by the set's size when ``scale_local_gradients``); ``register_local_var`` adds more."""
    if not _optimizer.is_keras_optimizer(optimizer):
        raise TypeError(f"PartialDistributedOptimizer: `optimizer` must be a Keras optimizer (Keras 3, or "
                        f"Keras 2 from tf_keras), got {type(optimizer).__name__}")
    return _optimizer.DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups, process_set=process_set,
        scale_local_gradients=scale_local_gradients, local_layers=local_layers)


def allreduce(value: Any, name: str | None = None, average: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Any = None, compression: Any = Compression.none,
              process_set: ProcessSet = global_process_set) -> Any:
    """Horovod Keras' allreduce of a value (tensor, array or number), argument order kept."""
    return _allreduce(value, average=average, compression=compression, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor, name=name, process_set=process_set)


def allgather(value: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> Any:
    return _allgather(value, name=name, process_set=process_set)


def broadcast(value: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    return _broadcast(value, root_rank, name=name, process_set=process_set)


def reducescatter(value: Any, name: str | None = None, op: Any = Average,
                  process_set: ProcessSet = global_process_set) -> Any:
    return _reducescatter(value, op=op, name=name, process_set=process_set)


def broadcast_global_variables(root_rank: int, model: Any = None) -> None:
    """Broadcast ``model``'s variables (and its built optimizer's) from ``root_rank``.

    Differs: TensorFlow 2 runs eagerly and has no global variable collection (Horovod's Keras
    function needs a TF1 session), so the model must be given.
    """
    if model is None:
        raise ValueError("broadcast_global_variables: eager TensorFlow has no global variables; pass `model=`")
    broadcast_variables(model.variables, root_rank)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", True):
        broadcast_variables(_optimizer.shared_variables(optimizer), root_rank)


def load_model(filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None,
               compression: Any = Compression.none, legacy_opts: bool = False) -> Any:
    """``tf.keras.models.load_model`` whose compiled optimizer allreduces gradients (state kept).
    ``legacy_opts`` is accepted for Horovod's signature: the saved optimizer's own class is loaded."""
    keras = flavor.user_keras()
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        _optimizer.wrap_in_place(model.optimizer, compression=compression)
    return model


__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "SyncBatchNormalization",
           "broadcast_global_variables", "load_model", "callbacks", "elastic", "init", "shutdown", "size", "rank",
           "local_size", "local_rank", "allreduce", "allgather", "broadcast"]
