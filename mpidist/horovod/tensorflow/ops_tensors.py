"""Horovod's ``*_op`` forms: the basics as int32 tensors (constants of this process)."""
from __future__ import annotations

import tensorflow as tf

from . import basics
from .process_sets import ProcessSet, global_process_set


def size_op(process_set_id: int = 0, name: str | None = None, process_set: ProcessSet | None = None) -> tf.Tensor:
    ps = process_set if process_set is not None else _by_id(process_set_id, "size_op")
    return tf.constant(ps.require_engine("size_op").size, tf.int32, name=name)


def rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(basics.rank(), tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(basics.local_size(), tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(basics.local_rank(), tf.int32, name=name)


def cross_size_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(basics.cross_size(), tf.int32, name=name)


def cross_rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(basics.cross_rank(), tf.int32, name=name)


def _by_id(set_id: int, where: str) -> ProcessSet:
    from .process_sets import all_sets
    basics.check_initialized(where)
    for ps in all_sets():
        if ps.process_set_id == set_id:
            return ps
    if set_id == 0:
        return global_process_set
    raise ValueError(f"{where}: no process set with id {set_id}")


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 when this rank is in the process set, else 0 (an int32 tensor)."""
    return tf.constant(int(_by_id(process_set_id, "process_set_included_op").included()), tf.int32, name=name)
