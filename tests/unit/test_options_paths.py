"""One per-call options type below the API, one meaning per value.

- The public API's options (CommunicationOptions, CollectiveHints, TensorFlow's) become CallOptions
  once, where they come in; strategies, cross-device ops and the engine pass CallOptions on.
- In every options type None means "not set" (``mpidist.rc`` applies) and 0 is a value over rc:
  ``bytes_per_pack=0`` automatic packing, ``timeout_seconds=0`` no deadline.
- Options with nothing set are the engine's plain call (its cached fast path included).
"""
from __future__ import annotations

import numpy as np
import pytest

import mpidist
from mpidist import rc
from mpidist.collectives import Engine
from mpidist.collectives.options import CallOptions, Resolved
from mpidist.cross_device import ops as ops_lib
from mpidist.cross_device.options import CollectiveHints, CommunicationOptions, as_options, call_options_of


def test_none_is_not_set_and_zero_is_a_value_for_bytes_per_pack():
    with rc.override(bytes_per_pack=4096):
        assert CallOptions().resolve().bytes_per_pack == 4096             # None: rc's
        assert CallOptions(bytes_per_pack=0).resolve().bytes_per_pack == 0  # 0: automatic, over rc
        assert CommunicationOptions().call_options().resolve().bytes_per_pack == 4096
        assert CommunicationOptions(bytes_per_pack=0).call_options().resolve().bytes_per_pack == 0
        assert CollectiveHints().bytes_per_pack is None
    # merging: a set 0 wins, None inherits (merged and merge alike)
    assert CallOptions(bytes_per_pack=64).merged(CallOptions(bytes_per_pack=0)).bytes_per_pack == 0
    assert CallOptions(bytes_per_pack=64).merged(CallOptions()).bytes_per_pack == 64
    assert CallOptions(num_packs=2).merged(CallOptions(bytes_per_pack=0)).num_packs is None
    assert CommunicationOptions(bytes_per_pack=64).merge(CommunicationOptions(bytes_per_pack=0)).bytes_per_pack == 0
    assert CommunicationOptions(bytes_per_pack=64).merge(CommunicationOptions()).bytes_per_pack == 64


def test_zero_timeout_is_no_deadline_over_rc_on_every_path():
    with rc.override(timeout_seconds=5):
        assert CallOptions(timeout_seconds=0).resolve().timeout is None
        assert CallOptions(bytes_per_pack=8).merged(CallOptions(timeout_seconds=0)).resolve().timeout is None
        assert call_options_of(CommunicationOptions(timeout_seconds=0), "f").resolve().timeout is None
        assert CallOptions().resolve().timeout == 5


def test_tensorflow_objects_cannot_say_not_set_so_their_zero_is_not_set():
    class TFOptions:  # what tf.distribute.experimental.CommunicationOptions() carries by default
        bytes_per_pack, timeout_seconds = 0, None
    assert as_options(TFOptions(), "f").bytes_per_pack is None


def test_the_api_edge_converts_once():
    assert call_options_of(None, "f") == CallOptions() and call_options_of(None, "f").empty
    hints = CollectiveHints(bytes_per_pack=32, timeout_seconds=9)
    call = call_options_of(CommunicationOptions(timeout_seconds=3), "f", experimental_hints=hints)
    assert call == CallOptions(bytes_per_pack=32, timeout_seconds=3)  # the options' set fields over the hints'
    assert not call.empty and CallOptions(implementation="ring").empty is False


class SpyEngine:
    """Records what a CrossDeviceOps hands the engine."""

    rank, size = 0, 1

    def __init__(self):
        self.calls = []

    def allreduce(self, value, op="sum", **kwargs):
        self.calls.append(kwargs)
        return value


@pytest.mark.parametrize("ops, expected", [
    # the implementation travels in the options, with who asked for it (no context variable)
    (lambda: mpidist.NcclAllReduce(num_packs=2), CallOptions(timeout_seconds=3, num_packs=2, implementation="nccl",
                                                             requested_by="NcclAllReduce")),
    (lambda: mpidist.MPIAllReduce(), CallOptions(bytes_per_pack=0, timeout_seconds=3)),
    (lambda: mpidist.MPIAllReduce(bytes_per_pack=128), CallOptions(bytes_per_pack=0, timeout_seconds=3)),
    (lambda: mpidist.HierarchicalCopyAllReduce(), CallOptions(timeout_seconds=3, num_packs=1,
                                                              algorithm="hierarchical")),
])
def test_cross_device_ops_hand_the_engine_one_call_options(ops, expected):
    engine = SpyEngine()
    ops().bind(engine).reduce("sum", np.ones(2), options=CommunicationOptions(bytes_per_pack=0, timeout_seconds=3))
    assert engine.calls == [{"options": expected}]


def test_numpy_strategy_call_options_are_call_options():
    with mpidist.rc.override(framework="numpy"):
        with mpidist.MultiWorkerMirroredStrategy(communication_options=CommunicationOptions(timeout_seconds=60)) as s:
            ext = s.extended
            assert ext.default_call_options == CallOptions(timeout_seconds=60)
            assert ext.call_options(None, "f") is ext.default_call_options
            assert ext.call_options(CollectiveHints(bytes_per_pack=8), "f") == \
                CallOptions(bytes_per_pack=8, timeout_seconds=60)


def test_options_with_nothing_set_are_a_plain_engine_call():
    assert Engine._options("allreduce", None, None, None, None, None, CallOptions()) is Resolved.defaults()
    engine = Engine(local_size=1)
    try:
        x = np.arange(4.0)
        engine.allreduce(x, "sum", options=CallOptions())
        assert engine.pipeline.fast.lookup("sum", x) is not None  # remembered: the next repeat is fast
    finally:
        engine.close()


def test_tensorflow_bridge_sets_no_deadline_for_timeout_zero():
    tf = pytest.importorskip("tensorflow")
    from mpidist.tensorflow import collectives

    class Echo:
        def allreduce(self, value, op="sum", *, options=None):
            return value

    def ops_of(options):
        graph = tf.function(lambda x: collectives.allreduce(Echo(), [x], "sum", options)[0]) \
            .get_concrete_function(tf.TensorSpec([2], tf.float32)).graph
        return [op.type for op in graph.get_operations()]

    with rc.override(timeout_seconds=5):
        timed = ops_of(CallOptions())  # rc's deadline: the op reports a missed one (deadline_op.py)
        untimed = ops_of(CallOptions(timeout_seconds=0))
    assert len(untimed) < len(timed)  # 0: no deadline over rc, so no deadline reporting in the graph
