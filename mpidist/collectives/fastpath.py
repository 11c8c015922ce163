"""Cached fast paths for repeated allreduce calls: one array, or a flat list/tuple/dict of arrays.

A training loop reduces the same dtypes and shapes every step (a gradient, or the list of all
gradients). The first such call takes the engine's general path (validation, planning, agreement
key); the engine then asks :meth:`FastPaths.remember` (on its pipeline, ``pipeline.fast``) to cache
what cannot change for the same dtypes and shapes: the agreement hash, the pack plan (the same
``packing.plan`` as the general path, so ranks on either path issue identical MPI calls), wire
dtypes, MPI ops and the offsets of each leaf in its pack. A later call with the same op, leaf types,
dtypes and shapes then does only: agreement (one 24-byte allreduce; overlapped with the data when
this repeats the previous collective's signature, see agreement.py, ``Agreement.bind``), one
``np.concatenate`` into a recycled buffer per pack (each buffer a ``buffers.Slot``: the block of the
last call, tried first), the MPI call (``Allreduce``, or ``Iallreduce`` + wait from
``rc.iallreduce_threshold`` bytes, as the general path), MEAN's division, and slicing the results
out as views. No Python code runs per leaf: the key (leaf types, dtypes, shapes) and the result
views are built by ``map`` over precomputed slices and shapes. A dict is cached per key order: its
values are packed in the general path's order (sorted keys, nest.py) and the result is rebuilt in
the caller's order. Nests of nests of arrays (a dict of lists) are cached per structure the same
way, their leaves gathered and their results rebuilt by functions compiled once (nestplan.py).

Only plain calls are cached: default packing and algorithm, no deadline, no timeline, leaves that
are NumPy arrays already in their wire dtype, and packs that the flat algorithm carries. Entries
are dropped whenever a setting changes (``rc.generation``). The agreement key, its hash and the
stall monitor come from the pipeline's public methods (pipeline.py), as on the general path.

Device arrays (CuPy) have cached paths too, built by collectives/gpu/fast.py, which registers
itself here (:meth:`FastPaths.attach_devices`) at the pipeline's first GPU collective: one CuPy
array, or a list/tuple of them, keyed by op, dtypes, shapes, strides (contiguous arrays only), the
arrays' device, the current device and the GPU implementation asked for (a context variable).
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from .._config import rc
from . import allreduce, buffers, nest, nestplan, packing
from .algorithms import choose, flat
from .algorithms.flat import posts_allreduce
from .ops import Op, finish_mean, rules

_MAX_ENTRIES = 256
_NDARRAY = {np.ndarray}
_DTYPE, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")


def _signature(leaves: Any) -> tuple:
    """Each leaf's type, dtype and shape (three ``map``s: no Python code per leaf)."""
    return tuple(map(type, leaves)), tuple(map(_DTYPE, leaves)), tuple(map(_SHAPE, leaves))


def _leaves_key(op: Any, kind: type, leaves: Any) -> tuple:
    """The cache key of a list/tuple of arrays: op, container, then :func:`_signature`."""
    return (op, kind, *_signature(leaves))


def _dict_key(op: Any, value: dict) -> tuple:
    """The cache key of a dict of arrays: op, its keys in their order, then :func:`_signature`."""
    return (op, tuple(value), *_signature(value.values()))


class FastPaths:
    """One pipeline's cache: ``lookup`` before the general path, ``remember`` after it."""

    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline
        self._arrays: dict[tuple, tuple[int, Callable]] = {}
        self._lists: dict[tuple, tuple[int, Callable]] = {}
        self._dicts: dict[tuple, tuple[int, Callable]] = {}
        self._nests: dict[tuple, tuple[int, Callable | None]] = {}  # None: a nest the cached path refuses
        self._devices: dict[tuple, tuple[int, Callable]] = {}
        self._device_kind: type | None = None  # cupy.ndarray, once collectives/gpu registered
        self._current_device: Callable[[], int] = int
        self._build_device: Callable[[Any, Op, Any, str], Callable | None] | None = None

    def clear(self) -> None:
        """Forget every cached call (the pipeline is closed or its communicator replaced)."""
        self._arrays.clear()
        self._lists.clear()
        self._dicts.clear()
        self._nests.clear()
        self._devices.clear()

    def attach_devices(self, kind: type, current_device: Callable[[], int],
                       build: Callable[[Any, Op, Any, str], Callable | None]) -> None:
        """Cache calls on arrays of type ``kind`` too (collectives/gpu/fast.py): ``current_device()``
        and the call's implementation are part of their key, ``build(op, red, value, implementation)``
        makes the cached function (or None: leave the call to the general path)."""
        self._device_kind, self._current_device = kind, current_device
        self._build_device = build

    def attached(self, kind: type) -> bool:
        """Whether calls on arrays of type ``kind`` are cached (:meth:`attach_devices`)."""
        return self._device_kind is kind

    def device_key(self, op: Any, value: Any, implementation: str = "auto") -> tuple:
        """The key of a call on device arrays (what :meth:`lookup` builds inline)."""
        kind = type(value)  # (not `type(value) is ...`: mypy would narrow `value` to object)
        if kind is self._device_kind:
            return (op, value.dtype, value.shape, value.strides, value.data.device_id, self._current_device(),
                    implementation)
        return (op, type(value), tuple([(type(a), a.dtype, a.shape, a.strides, a.data.device_id) for a in value]),
                self._current_device(), implementation)

    def lookup(self, op: Any, value: Any, implementation: str = "auto") -> Callable | None:
        """The cached function for ``value`` (called with ``value``), or None. ``implementation``
        (the call's, for device arrays: auto, ring or nccl) is part of a device call's key."""
        kind = type(value)
        entry: tuple[int, Callable | None] | None
        if kind is np.ndarray:
            if not value.flags.c_contiguous:
                return None
            entry = self._arrays.get((op, value.dtype, value.shape))
        elif kind is list or kind is tuple:
            try:
                if value and type(value[0]) is self._device_kind:  # device_key, inline
                    entry = self._devices.get((op, kind, tuple([(type(a), a.dtype, a.shape, a.strides,
                                                                 a.data.device_id) for a in value]),
                                               self._current_device(), implementation))
                else:
                    entry = self._lists.get(_leaves_key(op, kind, value))
            except (AttributeError, TypeError):  # a container or other leaf inside: a nest of nests?
                entry = self._nested(op, value)
        elif kind is dict:
            try:
                entry = self._dicts.get(_dict_key(op, value))
            except (AttributeError, TypeError):  # a container or other leaf inside: a nest of nests?
                entry = self._nested(op, value)
        elif kind is self._device_kind:  # device_key, inline: no call on the hot path
            entry = self._devices.get((op, value.dtype, value.shape, value.strides, value.data.device_id,
                                       self._current_device(), implementation))
        else:
            return None
        if entry is None or entry[0] != rc.generation:
            return None
        return entry[1]

    def remember(self, op: Any, red: Op, value: Any, implementation: str = "auto") -> None:
        """Cache ``value``'s call if it qualifies (see the module docstring)."""
        if rc.timeline or rc.timeout_seconds is not None or rc.compression != "none":  # compression.py's path
            return
        kind = type(value)
        if kind is np.ndarray:
            if value.flags.c_contiguous:
                self._store(self._arrays, (op, value.dtype, value.shape), self._array_path(red, value))
        elif (kind is list or kind is tuple) and 1 < len(value) and set(map(type, value)) == _NDARRAY:
            structure = nest.structure_key(nest.flatten(value)[1])  # the general path's text, so keys match
            self._store(self._lists, _leaves_key(op, kind, value), self._list_path(red, list(value), kind, structure))
        elif kind is dict and 1 < len(value) and set(map(type, value.values())) == _NDARRAY:
            self._store(self._dicts, _dict_key(op, value), self._dict_path(red, value))
        elif self._build_device is not None and (kind is self._device_kind or (
                (kind is list or kind is tuple) and value and all([type(a) is self._device_kind for a in value]))):
            self._store(self._devices, self.device_key(op, value, implementation),
                        self._build_device(op, red, value, implementation))
        elif (kind is list or kind is tuple or kind is dict) and \
                set(map(type, value.values() if kind is dict else value)) != _NDARRAY:  # a nest of nests
            try:
                key = (op, nestplan.key(value))
            except TypeError:  # other containers or leaves: general path
                return
            known = self._nests.get(key)
            if known is None or known[0] != rc.generation:  # (a nest the path refuses is remembered too)
                if len(self._nests) >= _MAX_ENTRIES:
                    self._nests.clear()
                self._nests[key] = (rc.generation, self._nest_path(red, value))

    def _nested(self, op: Any, value: Any) -> tuple[int, Callable | None] | None:
        if not self._nests:
            return None
        try:
            return self._nests.get((op, nestplan.key(value)))
        except TypeError:  # another container or leaf: general path
            return None

    @staticmethod
    def _store(cache: dict, key: tuple, path: Callable | None) -> None:
        if path is None:
            return
        if len(cache) >= _MAX_ENTRIES:
            cache.clear()
        cache[key] = (rc.generation, path)

    # -- building the cached functions ----------------------------------------------------------

    def _agreed(self, red: Op, structure: str, arrays: list[Any], data: Callable, variant: str | None = None,
                steps: tuple | None = None) -> Callable | None:
        """``data`` with the agreement step around it, as on the general path: the same key, its hash
        computed once, the same speculation (agreement.py). ``variant``: what else the general path
        agreed on (the GPU path's implementation); ``steps``: the data steps ``data`` issues, which
        must be the recipe the general path recorded (collectives/gpu/recipes.py). None: leave this
        call to the general path. One rank has nothing to agree with: no exchange."""
        pipeline = self._pipeline
        if not rc.check_agreement or pipeline.size == 1:
            return data
        key = pipeline.key("allreduce", (red.value, None), structure, allreduce.signature(arrays),
                           rc.algorithm if variant is None else f"{rc.algorithm}|{variant}", rc.bytes_per_pack,
                           None, False)
        h = pipeline.agreement_hash(key)
        agreed_on = pipeline.agreement
        last = agreed_on.last  # the general path has just agreed on this very key: its data steps
        if last is None or last[0] != h or (steps is not None and last[1] != steps):
            return None
        return agreed_on.bind(h, key, "allreduce", last[1], data)

    def bound(self, red: Op, structure: str, arrays: list[Any], data: Callable, variant: str,
              steps: tuple) -> Callable | None:
        """A device path's cached function (collectives/gpu/fast.py): ``data`` with the agreement and
        the stall monitor around it, as for host arrays; see :meth:`_agreed`."""
        run = self._agreed(red, structure, arrays, data, variant, steps)
        return None if run is None else self._monitored(run)

    def _flat(self, nbytes: int) -> bool:
        topo = self._pipeline.topology
        return choose(rc.algorithm, topo, nbytes) is flat

    def _array_path(self, red: Op, value: np.ndarray) -> Callable | None:
        wire, mop = rules(value.dtype, red, "allreduce", "leaf 0 of `value`")
        if not self._flat(value.size * wire.itemsize):
            return None
        comm, size = self._pipeline.comm, self._pipeline.size
        posted = posts_allreduce(value.size * wire.itemsize, rc.iallreduce_threshold, False)
        if wire != value.dtype:  # bool (as uint8), float16 ...: the general path's conversions
            if posted:
                def transfer(send: np.ndarray, recv: np.ndarray) -> None:
                    comm.Iallreduce(send, recv, mop).Wait()
            else:
                def transfer(send: np.ndarray, recv: np.ndarray) -> None:
                    comm.Allreduce(send, recv, mop)
            run = self._agreed(red, "*", [value], lambda x: allreduce.one(x, wire, mop, red, size, transfer))
            return None if run is None else self._monitored(run)
        # the array is its own send buffer; the result comes from this call's slot of the pool
        # (buffers.Slot), in the array's shape; MEAN divides it in place: allreduce.one, unrolled
        take = buffers.Slot(value.size, wire, value.shape if value.ndim != 1 else None).take
        mean = red is Op.MEAN and size > 1
        if posted:
            def data(x: np.ndarray) -> np.ndarray:
                recv = take()
                comm.Iallreduce(x, recv, mop).Wait()
                if mean:
                    finish_mean(recv, size)
                return recv
        else:
            def data(x: np.ndarray) -> np.ndarray:
                recv = take()
                comm.Allreduce(x, recv, mop)
                if mean:
                    finish_mean(recv, size)
                return recv
        run = self._agreed(red, "*", [value], data)
        return None if run is None else self._monitored(run)

    def _list_path(self, red: Op, arrays: list[np.ndarray], kind: type, structure: str) -> Callable | None:
        """The cached function of a list/tuple (``kind``) of arrays: per pack, one concatenate into a
        recycled buffer, the MPI call, MEAN's division, and the leaves' results cut out as views by
        ``map`` over precomputed slices and shapes (no Python code runs per leaf)."""
        dtypes = [a.dtype for a in arrays]
        rule = {d: rules(d, red, "allreduce", "a leaf of `value`") for d in set(dtypes)}
        if any(rule[d][0] != d for d in dtypes):  # dtype conversions (float16, bool): general path
            return None
        nbytes = [a.nbytes for a in arrays]
        plan = packing.plan(nbytes, dtypes, rc.bytes_per_pack, None)
        if not all(self._flat(sum(nbytes[i] for i in pack)) for pack in plan):
            return None
        comm, size = self._pipeline.comm, self._pipeline.size
        mean = red is Op.MEAN and size > 1
        steps = []
        for pack in plan:
            dtype = dtypes[pack[0]]
            slices, shapes, at = [], [], 0
            for i in pack:
                n = arrays[i].size
                slices.append(slice(at, at + n))
                shapes.append(arrays[i].shape)
                at += n
            flat_only = all(len(shape) == 1 for shape in shapes)
            steps.append((pack, rule[dtype][1], slices, None if flat_only else shapes,
                          posts_allreduce(at * dtype.itemsize, rc.iallreduce_threshold, False),
                          buffers.Slot(at, dtype).take if len(pack) > 1 else None, buffers.Slot(at, dtype).take))
        whole = len(plan) == 1 and plan[0] == list(range(len(arrays)))
        count = len(arrays)
        reshape = np.ndarray.reshape

        def data(leaves: list | tuple) -> list | tuple:
            results: list[Any] = [None] * count if not whole else []
            for pack, mop, slices, shapes, posted, packed, received in steps:
                if packed is None:
                    send = np.ascontiguousarray(leaves[pack[0]]).reshape(-1)
                else:
                    send = packed()
                    np.concatenate(leaves if whole else list(map(leaves.__getitem__, pack)), axis=None, out=send)
                recv = received()
                if posted:
                    comm.Iallreduce(send, recv, mop).Wait()
                else:
                    comm.Allreduce(send, recv, mop)
                if mean:
                    finish_mean(recv, size)
                views = map(recv.__getitem__, slices)
                if shapes is not None:
                    views = map(reshape, views, shapes)
                if whole:
                    results = list(views)
                else:
                    for _ in map(results.__setitem__, pack, views):
                        pass
            return results if kind is list else tuple(results)

        run = self._agreed(red, structure, arrays, data)
        return None if run is None else self._monitored(run)

    def _dict_path(self, red: Op, value: dict) -> Callable | None:
        """The cached function of a dict of arrays: the list path on its values in the general path's
        order (sorted keys, nest.flatten), the result rebuilt in the dict's own key order."""
        leaves, tree = nest.flatten(value)
        _, _, ordered, order, _ = tree
        run = self._list_path(red, leaves, list, nest.structure_key(tree))
        if run is None:
            return None
        position = {k: i for i, k in enumerate(ordered)}
        perm = [position[k] for k in order]
        pick = operator.itemgetter(*ordered)

        def by_keys(d: dict) -> dict:
            results = run(list(pick(d)))
            return dict(zip(order, map(results.__getitem__, perm)))
        return by_keys

    def _nest_path(self, red: Op, value: Any) -> Callable | None:
        """The cached function of a nest of nests of arrays: its leaves gathered and its result rebuilt
        by functions compiled once per structure (nestplan.py), the list path in between."""
        leaves, tree = nest.flatten(value)
        if not leaves or set(map(type, leaves)) != _NDARRAY:
            return None
        run = self._list_path(red, leaves, list, nest.structure_key(tree))
        if run is None:
            return None
        gather, build = nestplan.walkers(tree)

        def nested(v: Any) -> Any:
            out: list = []
            gather(v, out)
            return build(run(out), 0)[0]
        return nested

    def _monitored(self, run: Callable) -> Callable:
        monitor = self._pipeline.monitor
        if monitor is None:
            return run

        enter, leave = monitor.enter, monitor.leave

        def watched(value: Any) -> Any:
            enter("allreduce")
            try:
                return run(value)
            finally:
                leave()
        return watched
