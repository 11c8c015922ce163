"""Auto-sharding of ``experimental_distribute_dataset``'s input, as TensorFlow's MWMS does it.

``dataset`` yields global batches of B. The policy is ``dataset.options().experimental_distribute.
auto_shard_policy``; with N ranks, rank r gets:

- FILE: the files r, r + N, r + 2N, ... of every file-reading source (TFRecordDataset,
  TextLineDataset, FixedLengthRecordDataset, ``list_files`` + interleave, ...), through
  TensorFlow's own graph rewrite, so it reads whole files and nothing else. The pipeline's
  batches of B (now of this rank's files) are cut into N pieces of B/N rows (``numpy.array_split``
  sizes), all kept, one per step: per-replica batches of B/N, global batches of about B. Ranks
  whose files hold fewer records take fewer steps; the iterator's per-step agreement gives them
  empty batches until every rank is done. Fewer files than ranks is an error on every rank.
- DATA: every rank reads everything and keeps its block of each global batch (rows cut as
  ``numpy.array_split`` cuts: the first B % N ranks get one row more; a short last batch gives
  short or empty blocks, nothing dropped). This is what TensorFlow's rebatch + shard gives for full
  batches: disjoint, complete, the same number of steps on every rank.
- AUTO: FILE when the dataset reads at least N files (counted in its graph), else DATA, with a
  warning from the chief saying why (as TensorFlow warns when AUTO falls back to DATA).
- OFF: no sharding, as in TensorFlow: every rank reads everything, each global batch cut into N
  pieces and every rank takes all N, one per step, in an order rotated by rank; so each rank sees
  every element once per epoch, in N times the steps, and (for full global batches) at each step
  the ranks hold disjoint pieces of one global batch.
- HINT: TensorFlow's rewrite fills ``shard(SHARD_HINT, SHARD_HINT)`` placeholders with (N, r);
  then as FILE (every piece kept).

The file count comes from the dataset's GraphDef: the readers are found (also inside flat_map /
interleave functions) and the source of their file names is followed up to a constant list (in
eager mode ``list_files`` has already been evaluated into one). When the count cannot be found,
AUTO uses DATA (with the reason in the warning) and FILE is left to TensorFlow's rewrite, which
fails at run time on a rank without files (its exception ends the job).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from . import _tf_private

Policy = tf.data.experimental.AutoShardPolicy
READERS = frozenset({"TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
                     "FixedLengthRecordDatasetV2", "ArrayRecordDataset", "RecordIODataset", "SSTableDataset"})
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")
NO_READER, UNCOUNTED = -2, -1  # file counts that are not counts


@dataclass(frozen=True)
class FileCount:
    """What the graph says about the files ``dataset`` reads."""
    count: int  # >= 0: the number of files of the smallest file source; NO_READER; UNCOUNTED
    detail: str  # why, for messages


def _node_name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def count_files(dataset: tf.data.Dataset) -> FileCount:
    """How many files the readers in ``dataset`` read (the smallest source when there are several)."""
    try:
        graph = _tf_private.serialized_graph(dataset)
    except Exception as error:
        return FileCount(UNCOUNTED, f"its graph could not be read ({type(error).__name__}: {error})")
    nodes = {n.name: n for n in graph.node}
    calls = {f.signature.name: {a.func.name for n in f.node_def for a in n.attr.values() if a.func.name}
             for f in graph.library.function}
    reading = {f.signature.name for f in graph.library.function if any(n.op in READERS for n in f.node_def)}
    while True:  # functions that read files themselves or through the functions they call
        more = {name for name, called in calls.items() if called & reading} - reading
        if not more:
            break
        reading |= more
    counts: list[int | None] = []
    reasons: list[str] = []
    for node in graph.node:
        if node.op in READERS:  # a reader in the main graph: input 0 holds the file names
            counts.append(_count_const(nodes, _node_name(node.input[0])))
        elif any(a.func.name in reading for a in node.attr.values()):
            # flat_map / interleave of a reading function: input 0 is the dataset of file names
            counts.append(_count_source(nodes, _node_name(node.input[0]), reasons))
    if reading and not counts:
        counts.append(None)
        reasons.append("its readers are not called from the pipeline itself")
    if not counts:
        sources = sorted({n.op for n in graph.node if _DATASET_OP.search(n.op) and
                          not any(_is_dataset(nodes, i) for i in n.input)})
        return FileCount(NO_READER, f"it reads no files (its source: {', '.join(sources) or 'unknown'})")
    known = [c for c in counts if c is not None]
    if len(known) < len(counts):
        return FileCount(UNCOUNTED, "the number of files it reads could not be found in its graph"
                         + (f" ({'; '.join(reasons)})" if reasons else ""))
    return FileCount(min(known), f"it reads {min(known)} file(s)")


def _is_dataset(nodes: dict, ref: str) -> bool:
    node = nodes.get(_node_name(ref))
    return node is not None and bool(_DATASET_OP.search(node.op))


def _count_source(nodes: dict, name: str, reasons: list[str]) -> int | None:
    """Follow a dataset of file names up to its source; the number of names there."""
    node = nodes.get(name)
    while node is not None:
        inputs = [i for i in node.input if not i.startswith("^") and _is_dataset(nodes, i)]
        if len(inputs) > 1:
            reasons.append(f"file names come from several datasets ({node.op})")
            return None
        if not inputs:
            break
        node = nodes[_node_name(inputs[0])]
    if node is None:
        return None
    if node.op == "TensorDataset":
        return 1
    if node.op == "TensorSliceDataset" and node.input:
        return _count_const(nodes, _node_name(node.input[0]), rows=True)
    reasons.append(f"file names come from {node.op}")
    return None


def _count_const(nodes: dict, name: str, rows: bool = False) -> int | None:
    node = nodes.get(name)
    while node is not None and node.op == "Identity" and node.input:
        node = nodes.get(_node_name(node.input[0]))
    if node is None or node.op != "Const":
        return None
    dims = [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
    if rows:
        return dims[0] if dims else None
    return int(np.prod(dims)) if dims else 1


# -- cutting global batches --------------------------------------------------------------------

def _rows(x: Any) -> tf.Tensor:
    if isinstance(x, tf.RaggedTensor):
        return x.nrows(out_type=tf.int64)
    if isinstance(x, tf.SparseTensor):
        return x.dense_shape[0]
    return tf.shape(x, out_type=tf.int64)[0]


def _take(x: Any, start: tf.Tensor, count: tf.Tensor) -> Any:
    if isinstance(x, tf.SparseTensor):
        begin = tf.concat([[start], tf.zeros_like(x.dense_shape[1:])], 0)
        return tf.sparse.slice(x, begin, tf.concat([[count], x.dense_shape[1:]], 0))
    if isinstance(x, (tf.Tensor, tf.RaggedTensor)):
        return x[start:start + count]
    return x


def _block(element: Any, index: Any, size: int) -> Any:
    """Block ``index`` of ``size`` of every component (``numpy.array_split`` rows)."""
    leaves = tf.nest.flatten(element)
    batch = _rows(leaves[0]) if leaves else tf.constant(0, tf.int64)
    index = tf.cast(index, tf.int64)
    base, extra = batch // size, batch % size
    start = index * base + tf.minimum(index, extra)
    count = base + tf.cast(index < extra, tf.int64)
    return tf.nest.map_structure(lambda x: _take(x, start, count), element)


def _per_element(dataset: tf.data.Dataset, method: str, fn: Callable[[Any], Any]) -> tf.data.Dataset:
    """``dataset.<method>(fn)`` with ``fn`` taking the whole element (tf.data splats tuples)."""
    if type(dataset.element_spec) is tuple:
        return getattr(dataset, method)(lambda *parts: fn(tuple(parts)))
    return getattr(dataset, method)(fn)


def check_batched(dataset: tf.data.Dataset, where: str) -> None:
    for spec in tf.nest.flatten(dataset.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is not None and shape.rank == 0:
            raise ValueError(f"{where}: `dataset` must yield batches (every component with a batch "
                             f"dimension first); got an element with a scalar component ({spec}). "
                             f"Batch it with the global batch size: dataset.batch(global_batch_size)")


def slice_batches(dataset: tf.data.Dataset, rank: int, size: int) -> tf.data.Dataset:
    """DATA: each global batch replaced by this rank's block of it."""
    return _per_element(dataset, "map", lambda element: _block(element, rank, size))


def all_pieces(dataset: tf.data.Dataset, rank: int, size: int) -> tf.data.Dataset:
    """FILE / OFF / HINT: each batch cut into ``size`` blocks, all kept, one per step, starting with
    block ``rank``; empty blocks (of batches shorter than ``size``) are skipped."""
    def pieces(element: Any) -> tf.data.Dataset:
        order = tf.data.Dataset.from_tensor_slices(tf.constant([(rank + j) % size for j in range(size)], tf.int64))
        blocks = order.map(lambda k: _block(element, k, size))
        return _per_element(blocks, "filter", lambda block: _rows(tf.nest.flatten(block)[0]) > 0)

    return _per_element(dataset, "flat_map", pieces)


# -- the policy --------------------------------------------------------------------------------

def policy_of(dataset: tf.data.Dataset) -> Any:
    return dataset.options().experimental_distribute.auto_shard_policy


def decide(policy: Any, files: list[int], size: int, where: str) -> tuple[str, str]:
    """(mode, warning or "") from the policy and every rank's file count; raises on every rank alike."""
    if len(set(files)) > 1:
        raise ValueError(f"{where}: the ranks see different numbers of files in `dataset` ("
                         f"{', '.join(f'rank {r}: {_describe(c)}' for r, c in enumerate(files))}); "
                         f"every rank must build the same pipeline over the same files")
    count = files[0]
    if policy == Policy.OFF:
        return "OFF", ""
    if policy == Policy.DATA:
        return "DATA", ""
    if policy == Policy.HINT:
        return "HINT", ""
    if policy == Policy.FILE:
        if count == NO_READER:
            raise ValueError(f"{where}: `dataset` reads no files, but auto_shard_policy=FILE needs a "
                             f"file-reading source (TFRecordDataset, TextLineDataset, list_files, ...); "
                             f"use AutoShardPolicy.DATA")
        if 0 <= count < size:
            raise ValueError(f"{where}: `dataset` has {count} file(s) but the job has {size} ranks; "
                             f"auto_shard_policy=FILE needs at least one file per rank (split the data "
                             f"into more files, or use AutoShardPolicy.DATA)")
        return "FILE", ""
    if count >= size:
        return "FILE", ""
    why = {NO_READER: "it reads no files", UNCOUNTED: "the number of files it reads could not be found"}.get(
        count, f"it has {count} file(s) but the job has {size} ranks")
    return "DATA", (f"{where}: auto_shard_policy=AUTO applies DATA sharding (every rank reads the whole "
                    f"dataset and keeps its block of each global batch) instead of FILE sharding, because "
                    f"{why}. Set dataset options' experimental_distribute.auto_shard_policy to "
                    f"AutoShardPolicy.DATA to silence this, or OFF to read everything on every rank")


def _describe(count: int) -> str:
    return {NO_READER: "no file reader", UNCOUNTED: "an uncounted number"}.get(count, str(count))


def shard(dataset: tf.data.Dataset, mode: str, rank: int, size: int) -> tf.data.Dataset:
    """This rank's per-replica batches under ``mode`` (see the module docstring)."""
    if mode == "DATA":
        return slice_batches(dataset, rank, size)
    if mode in ("FILE", "HINT"):
        dataset = _tf_private.auto_shard(dataset, size, rank, getattr(Policy, mode))
    return all_pieces(dataset, rank, size)


def fill_hints(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """One rank: ``shard(SHARD_HINT, SHARD_HINT)`` placeholders become shard(1, 0)."""
    return _tf_private.auto_shard(dataset, 1, 0, Policy.HINT)
