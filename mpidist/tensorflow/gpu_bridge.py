"""TensorFlow GPU tensors through the engine without host copies: DLPack to CuPy and back.

THIS PATH HAS NOT BEEN RUN ON A GPU YET (no GPU where it was written; see docs/gpu.md).

``collectives._call`` hands a call here when one of its tensors lives on a GPU and CuPy can run:

- each GPU-backed tensor becomes a CuPy array with ``cupy.from_dlpack(tf.experimental.dlpack.
  to_dlpack(t))``: zero copy. The capsule API is used because TF 2.21's ``Tensor.__dlpack__``
  rejects the ``stream`` argument that ``cupy.from_dlpack(tensor)`` passes;
- the engine's GPU path runs the collective (NCCL / MPI, see collectives/gpu);
- results go back with ``tf.experimental.dlpack.from_dlpack(array.__dlpack__())`` (a legacy capsule;
  ``toDlpack()``, deprecated in CuPy 14, where ``__dlpack__`` is missing): zero copy,
  except for results that do not start on a 256-byte boundary (views into a pack), which are
  copied once on the device;
- bfloat16 tensors never get here: collectives.py casts them to float32 first (on their device),
  so no CuPy bfloat16 array is needed (CuPy has them only from version 14);
- tensors TensorFlow keeps in host memory even on a GPU device (int32, and what ``tf.constant``
  makes: their ``backing_device`` is the CPU) go to the engine as NumPy arrays (:func:`host_copy`)
  and come back as host tensors; the engine moves them with the device ones in one collective;
- inside a ``tf.function`` the call is one ``tf.py_function`` op (``tf.numpy_function`` would
  copy every input to the host) placed on the tensors' GPU; its body does the same steps.

Streams: TensorFlow's CUDA streams cannot be reached from CuPy, so the device is synchronized
once before NCCL or MPI reads TensorFlow's buffers (``cudaDeviceSynchronize``: TensorFlow and CuPy
share the device's primary context), and CuPy's stream is synchronized before results are handed
to TensorFlow, which reads them on its own streams.

Memory: TensorFlow maps almost all GPU memory at start-up by default, leaving none for CuPy and
NCCL; :func:`prepare` (called when a strategy is built) turns on memory growth where CuPy is
installed and TensorFlow has not initialized its GPUs yet (else set ``TF_FORCE_GPU_ALLOW_GROWTH=true``).
"""
from __future__ import annotations

import importlib.util
import logging
from typing import Any, Callable, Sequence

import tensorflow as tf

from ..collectives.gpu import cupy_arrays, paths
from ..errors import GpuUnavailableError

_log = logging.getLogger("mpidist")
_ALIGN = 256
_told: set[str] = set()


def _gpu_device_name(name: str | None) -> bool:
    return name is not None and ":GPU:" in name.upper()


def backed_on_gpu(t: Any) -> bool:
    """Whether an eager tensor's memory is on a GPU (``backing_device``, not the op's device)."""
    return _gpu_device_name(getattr(t, "backing_device", None))


def placed_on_gpu(t: Any) -> bool:
    """Whether a tensor is (or, in a graph, will be) on a GPU."""
    if tf.executing_eagerly():
        return backed_on_gpu(t)
    if t.device:
        return _gpu_device_name(t.device)
    return bool(tf.config.list_logical_devices("GPU"))  # unplaced: TensorFlow prefers its GPU


def _tell_once(key: str, message: str, *args: Any) -> None:
    if key not in _told:
        _told.add(key)
        _log.warning(message, *args)


def wanted(tensors: Sequence[Any], implementation: str, where: str) -> bool:
    """Whether the call takes this bridge: a tensor is on a GPU and CuPy can run. With NCCL asked
    for and CuPy unusable, a clear error; otherwise GPU tensors take the host path, said once."""
    if not any(placed_on_gpu(t) for t in tensors):
        return False
    reason = cupy_arrays.cupy_reason()
    if reason is None:
        return True
    if implementation == "nccl":
        raise GpuUnavailableError(paths.unavailable_message(where, reason))
    _tell_once("host", "mpidist: GPU tensors go through host memory (tf.numpy_function) because %s", reason)
    return False


def host_copy(t: Any) -> Any:
    """A host-resident tensor's NumPy value (the only host copy this bridge makes; tests count it)."""
    return t.numpy()


def to_cupy(cp: Any, t: Any) -> Any:
    return cp.from_dlpack(tf.experimental.dlpack.to_dlpack(t))


def to_tensorflow(cp: Any, array: Any) -> Any:
    """A CuPy result as a TensorFlow GPU tensor sharing its memory."""
    if array.size == 0:
        with tf.device(f"/device:GPU:{array.device.id}"):
            return tf.zeros(array.shape, dtype=tf.as_dtype(array.dtype))
    if array.data.ptr % _ALIGN or not array.flags.c_contiguous:
        array = array.copy()  # CuPy's pool hands out aligned blocks
    capsule = array.__dlpack__() if hasattr(array, "__dlpack__") else array.toDlpack()
    return tf.experimental.dlpack.from_dlpack(capsule)


def run_eager(run: Callable[[list[Any]], list[Any]], tensors: Sequence[Any]) -> list[Any]:
    """Eager tensors in, ``run`` on CuPy arrays (host-backed ones as NumPy), TensorFlow tensors out."""
    cp = cupy_arrays.load_cupy()
    arrays = [to_cupy(cp, t) if backed_on_gpu(t) else host_copy(t) for t in tensors]
    device = next((a.device.id for a in arrays if cupy_arrays.is_device_array(a)), None)
    with cp.cuda.Device(device if device is not None else cp.cuda.Device().id):
        cp.cuda.runtime.deviceSynchronize()  # TensorFlow's streams have finished writing the inputs
        results = run(arrays)  # whose engine calls carry the implementation in their options
        cp.cuda.get_current_stream().synchronize()  # TensorFlow reads the results on its own streams
        return [to_tensorflow(cp, r) if cupy_arrays.is_device_array(r) else tf.convert_to_tensor(r)
                for r in results]


def call(name: str, run: Callable[[list[Any]], list[Any]], tensors: Sequence[Any],
         shapes: Callable[[tf.TensorShape], tf.TensorShape]) -> list[Any]:
    """The collective on ``tensors``: eagerly, or as one ``tf.py_function`` op on their GPU."""
    if tf.executing_eagerly():
        return run_eager(run, tensors)

    def func(*inputs: Any) -> list[Any]:
        return run_eager(run, list(inputs))

    device = next((t.device for t in tensors if _gpu_device_name(t.device)), "") or "/device:GPU:0"
    with tf.device(device):
        outs = tf.py_function(func, list(tensors), [t.dtype for t in tensors], name=name)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for out, t in zip(outs, tensors):
        out.set_shape(shapes(t.shape))
    return outs


def prepare() -> None:
    """Before TensorFlow initializes its GPUs: memory growth, so CuPy and NCCL find memory too."""
    if importlib.util.find_spec("cupy") is None:
        return
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except (RuntimeError, ValueError) as err:  # already initialized, or set otherwise
            _tell_once("growth", "mpidist: could not turn on TensorFlow GPU memory growth (%s); if CuPy or "
                       "NCCL run out of GPU memory, set TF_FORCE_GPU_ALLOW_GROWTH=true", err)
            return
