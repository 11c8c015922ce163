"""Gradient buckets: one all-reduce of a long list split into collectives that can overlap backprop.

A training step reduces its gradients with ONE call (``ReplicaContext.all_reduce(SUM, grads)``,
Keras' optimizer included) after the backward pass has built every gradient. Inside a
``tf.function`` nothing forces that call to wait for the whole backward pass: if the list is cut
into buckets and each bucket is its own collective op, the dataflow executor starts a bucket's
collective as soon as ITS gradients exist, while the rest of the backward pass still runs.

- Buckets follow the order backprop produces gradients: the REVERSE of the list's order (Keras
  and ``tape.gradient`` list gradients in the order of the variables, first layer first; the
  last layer's gradients are ready first). The first bucket holds the list's last tensors.
- Buckets are asked for with a pack size: ``bytes_per_pack`` B > 0 (the strategy's or the call's
  ``CommunicationOptions(bytes_per_pack=B)``, ``mpidist.rc.bytes_per_pack`` or Horovod's
  HOROVOD_FUSION_THRESHOLD). A bucket closes before the tensor that would take it over B bytes:
  the engine's pack rule (collectives/packing.py) walked backwards, so a bucket of one dtype is
  exactly one pack and bucketing adds no MPI call; a tensor of B bytes or more is a bucket of its
  own. **Automatic packing (0, the default) makes no buckets**: the list is one collective op,
  which the engine fuses into packs of up to 64 MiB (ResNet-50's 102 MB: 2 MPI calls) under ONE
  agreement, speculated from the second step on. Buckets are collectives of different
  signatures, and the agreement speculates only on a repeat of the previous collective's
  (collectives/agreement.py), so each bucket of a step pays a blocking agreement round trip: a
  price worth paying only where overlap hides more than that, which the user knows better
  (docs/overlap.md, docs/performance.md). With ``num_packs`` set there are no buckets either
  (one op, whose engine call splits the list into that many packs, as TensorFlow's cross-device
  ops do).
- Only the ORDER of the collectives is fixed (the bridge's ordering token,
  collectives.py): bucket 1, then 2, ... on every rank.
- Plans are made from static sizes, so every rank makes the same one; a list with a tensor of
  unknown size is reduced in one call, as without buckets.

Each element's reduction is the same as without buckets (an element-wise reduction over the
same ranks), so results are equal bit for bit as long as MPI sums an element's ranks in the same
order whatever the message size. Open MPI 5 on one machine does at 1, 2 and 4 ranks
(tests/mpi/test_tf_overlap.py at -n 1, 2, 4 and 4 with two fake nodes, where 800 KB buckets go flat
and one 2.4 MB pack goes hierarchical under ``rc.hierarchical_threshold`` = 1 MiB; raw ``Allreduce``
of 1 KB to 24 MB checked at -n 4), not at
3 (a few elements 1 ulp apart: its algorithm changes with the message size). An MPI
that picks a different algorithm per message size (e.g. a ring for large messages across nodes)
may sum in another order, and with more than 2 ranks an element can then differ in its last bit;
with 1 or 2 ranks (a + b == b + a) or with sums that are exact (integers) it cannot.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from .._config import rc
from ..collectives.options import CallOptions
from ..collectives.packing import backprop_buckets


def bucket_bytes(options: CallOptions) -> int | None:
    """The bucket size ``options`` gives (rc's default filled in), or None: no buckets (automatic
    packing, ``bytes_per_pack`` 0, or ``num_packs`` set)."""
    if options.num_packs is not None:
        return None
    size = rc.bytes_per_pack if options.bytes_per_pack is None else options.bytes_per_pack
    return int(size) or None


def nbytes(t: tf.Tensor) -> int | None:
    """Static size of ``t`` in bytes, or None when its shape is not fully known."""
    if not t.shape.is_fully_defined():
        return None
    return t.shape.num_elements() * t.dtype.size


def plan(sizes: Sequence[int | None], limit: int | None) -> list[list[int]]:
    """Indices of ``sizes`` in buckets, in backprop order: :func:`mpidist.collectives.packing.backprop_buckets`."""
    return backprop_buckets(sizes, limit)


def run_bucketed(reduce: Callable[[list[tf.Tensor]], list[tf.Tensor]], tensors: Sequence[tf.Tensor],
                 options: CallOptions) -> list[tf.Tensor]:
    """``reduce`` (one collective on a list) applied bucket by bucket, in backprop order; the
    results come back in the list's order."""
    tensors = list(tensors)
    buckets = plan([nbytes(t) for t in tensors], bucket_bytes(options))
    if len(buckets) <= 1:
        return reduce(tensors)
    out: list[Any] = [None] * len(tensors)
    for bucket in buckets:
        for i, r in zip(bucket, reduce([tensors[i] for i in bucket])):
            out[i] = r
    return out
