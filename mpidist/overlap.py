"""Gradient buckets for NumPy/CuPy training loops: reduce gradients while the backward pass runs.

A hand-written backward pass produces gradients last layer first. Instead of one all-reduce of
every gradient after it, :class:`GradientBuckets` takes each gradient as it is made (``add(i,
grad)``), and as soon as a bucket of them is complete starts that bucket's all-reduce on the
engine's progress thread (collectives/progress.py); ``result()`` waits for the buckets and returns
the reduced gradients in the variables' order::

    strategy = mpidist.MultiWorkerMirroredStrategy()
    buckets = mpidist.overlap.GradientBuckets(params, "mean", strategy=strategy)
    for batch in batches:
        ...                                              # forward pass
        for i in reversed(range(len(params))):           # backward pass: the last layer first
            buckets.add(i, grad_of(i))                   # a complete bucket starts its all-reduce
        grads = buckets.result()                         # reduced, in the order of params

Buckets are TensorFlow's (tensorflow/buckets.py; the rule is ``packing.backprop_buckets``): the
variables walked from the last, a bucket closing before the gradient that would take it over the
bucket size: ``bytes_per_pack`` of the call's ``options``, else of the strategy's
CommunicationOptions, else ``mpidist.rc.bytes_per_pack``; 0 (automatic, the default) means
**64 MiB**, the engine's automatic pack size (collectives/packing.py), so a bucket is one pack and
bucketing costs no MPI call more than one all-reduce of every gradient (a model of less than 64 MiB
of gradients is one bucket: give a smaller ``bytes_per_pack`` to overlap; each bucket then pays a
collective's latency and, as buckets differ in signature, a blocking agreement: agreement.py).
Buckets start strictly in that order, whatever order the gradients come in (a bucket waits for the
ones before it), so every rank issues the same collectives in the same order. Each bucket is one
all-reduce of a list through the strategy's own reduction (its cross-device ops and options, as
``extended.reduce_to``), or, with ``engine=``, through the engine; every element is reduced over
the same ranks as with one all-reduce of all gradients, so results are equal bit for bit where MPI
sums an element's ranks in the same order whatever the message size (docs/overlap.md).

Gradients must not be changed between ``add`` and ``result()`` (their all-reduce reads them on the
progress thread). Works in NumPy mode (strategies built without TensorFlow imported, or with
``rc.framework="numpy"``) and on an :class:`~mpidist.collectives.Engine`; in TensorFlow mode the
strategies bucket ``all_reduce`` inside ``tf.function`` already.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ._config import rc
from .collectives import Engine, progress
from .collectives.options import CallOptions
from .collectives.packing import FUSION_BYTES, backprop_buckets, packed_bucket_bytes
from .cross_device import ReduceOp, as_reduce_op, call_options_of
from .cross_device_ops import MPIAllReduce
from .strategies import StrategyExtended, get_strategy
from .validation import is_integer

DEFAULT_BUCKET_BYTES = FUSION_BYTES  # bytes_per_pack=0 (automatic): buckets of up to 64 MiB, one pack each


def bucket_bytes(options: CallOptions) -> int:
    """The bucket size: ``options.bytes_per_pack`` when set, else ``rc.bytes_per_pack``; 0 (automatic):
    64 MiB, the pack size (packing's rule)."""
    return packed_bucket_bytes(options.bytes_per_pack, rc.bytes_per_pack)


class GradientBuckets:
    """All-reduce gradients bucket by bucket as a backward pass adds them; see the module docstring.

    ``like``: the variables (arrays, or anything with ``shape`` and ``dtype``) whose gradients will be
    added, in their order; only shapes and dtypes are read, and every gradient must match its
    variable's. ``reduce_op``: a ReduceOp or its name (SUM, MEAN, MIN, MAX, PROD). ``strategy``: an
    mpidist strategy in NumPy mode (default: the current strategy); or ``engine``: an Engine.
    ``options``: CommunicationOptions (or CollectiveHints) for every bucket, over the strategy's.
    """

    def __init__(self, like: Sequence[Any], reduce_op: Any = ReduceOp.SUM, *, strategy: Any = None,
                 engine: Engine | None = None, options: Any = None) -> None:
        where = "GradientBuckets"
        if not isinstance(like, (list, tuple)) or not like:
            raise ValueError(f"{where}: `like` must be a non-empty list or tuple of the variables (arrays), got "
                             f"{like!r:.80}")
        self._shapes, self._dtypes = [], []
        for i, v in enumerate(like):
            shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
            if shape is None or dtype is None:
                raise TypeError(f"{where}: `like[{i}]` must be an array (with shape and dtype), got "
                                f"{type(v).__name__}")
            self._shapes.append(tuple(shape))
            self._dtypes.append(np.dtype(dtype))
        self._op = as_reduce_op(reduce_op, where)
        if engine is not None:
            if strategy is not None:
                raise ValueError(f"{where}: give `strategy` or `engine`, not both")
            if not isinstance(engine, Engine):
                raise TypeError(f"{where}: `engine` must be an mpidist.Engine, got {type(engine).__name__}")
            self._engine = engine
            self._reduce = MPIAllReduce().bind(engine).all_reduce_local
            opts = call_options_of(options, where)
        else:
            strategy = get_strategy() if strategy is None else strategy
            extended = getattr(strategy, "extended", None)
            if not isinstance(extended, StrategyExtended):
                raise TypeError(f"{where}: `strategy` must be an mpidist strategy in NumPy mode "
                                f"(built without TensorFlow imported, or with rc.framework=\"numpy\"; "
                                f"in TensorFlow mode all_reduce inside "
                                f"tf.function is bucketed already), got {type(strategy).__name__}")
            extended.check_open(where)
            self._engine = extended.engine
            opts = extended.call_options(options, where)
            self._reduce = lambda op, value, options, where: extended.all_reduce(op, value, options)
        self._options = opts
        self.bucket_bytes = bucket_bytes(opts)
        sizes = [math.prod(s) * d.itemsize for s, d in zip(self._shapes, self._dtypes)]
        self.plan: list[list[int]] = backprop_buckets(sizes, self.bucket_bytes)
        """The buckets, in the order they start (backprop order): lists of variable indices."""
        self._bucket_of = [0] * len(sizes)
        for b, bucket in enumerate(self.plan):
            for i in bucket:
                self._bucket_of[i] = b
        self._reset()

    def _reset(self) -> None:
        self._grads: list[Any] = [None] * len(self._shapes)
        self._left = [len(b) for b in self.plan]  # gradients each bucket still waits for
        self._started: list[progress.Pending] = []

    def __len__(self) -> int:
        return len(self._shapes)

    def add(self, index: int, grad: Any) -> None:
        """This step's gradient of variable ``index``; starts the all-reduce of every bucket that is
        then complete (in bucket order). ``grad`` must not change until :meth:`result` returns."""
        where = "GradientBuckets.add"
        n = len(self._shapes)
        if not is_integer(index):
            raise TypeError(f"{where}: `index` must be an int, got {type(index).__name__}")
        if not -n <= index < n:
            raise ValueError(f"{where}: `index` must be in [0, {n}) (one per variable of `like`), got {index}")
        index = int(index) % n
        shape, dtype = getattr(grad, "shape", None), getattr(grad, "dtype", None)
        if shape is None or dtype is None:
            raise TypeError(f"{where}: `grad` must be an array, got {type(grad).__name__}")
        if tuple(shape) != self._shapes[index] or np.dtype(dtype) != self._dtypes[index]:
            raise ValueError(f"{where}: `grad` of variable {index} must have shape {self._shapes[index]} and dtype "
                             f"{self._dtypes[index].name} (as `like[{index}]`), got {tuple(shape)} "
                             f"{np.dtype(dtype).name}")
        if self._grads[index] is not None:
            raise ValueError(f"{where}: the gradient of variable {index} was already added in this step "
                             f"(result() ends a step)")
        self._grads[index] = grad
        self._left[self._bucket_of[index]] -= 1
        while len(self._started) < len(self.plan) and self._left[len(self._started)] == 0:
            self._start(len(self._started))

    def _start(self, b: int) -> None:
        bucket = [self._grads[i] for i in self.plan[b]]
        pipeline = self._engine.pipeline
        pipeline.check_usable("GradientBuckets.add")
        op, options, reduce = self._op, self._options, self._reduce
        self._started.append(progress.worker(pipeline).submit(
            lambda: reduce(op, bucket, options, "GradientBuckets"),
            f"GradientBuckets bucket {b + 1} of {len(self.plan)}", bucket))

    def result(self, timeout: float | None = None) -> list[Any]:
        """Wait for every bucket; the reduced gradients in the variables' order. Ends the step (the next
        ``add`` starts a new one), also when a bucket's all-reduce raised (raised here). ``timeout``:
        seconds to wait at most, else TimeoutError (the step stays open: call again)."""
        missing = [i for i, g in enumerate(self._grads) if g is None]
        if missing:
            self._reset()
            shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            raise ValueError(f"GradientBuckets.result: {len(missing)} of the {len(self._grads)} gradients were "
                             f"not added in this step (variables {shown}); add(i, grad) each of them first")
        out: list[Any] = [None] * len(self._grads)
        try:
            for bucket, pending in zip(self.plan, self._started):
                for i, r in zip(bucket, pending.wait(timeout)):
                    out[i] = r
        except TimeoutError:
            raise
        except BaseException:
            self._reset()
            raise
        self._reset()
        return out

    def __repr__(self) -> str:
        return (f"GradientBuckets({len(self._shapes)} variables, {len(self.plan)} buckets of up to "
                f"{self.bucket_bytes} bytes, {self._op.name})")
