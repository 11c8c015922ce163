"""The value-adapter hook of mpidist.cross_device.ops: framework values go to the adapter that
recognises them; NumPy values never do, and never load TensorFlow."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mpidist
from mpidist.cross_device import ops as ops_lib


class Boxed:
    def __init__(self, value):
        self.value = value


class BoxAdapter:
    """Takes nests holding a Boxed; records what it was asked to do."""

    def __init__(self):
        self.calls = []

    def handles(self, value):
        return isinstance(value, Boxed) or (isinstance(value, (list, tuple)) and any(map(self.handles, value)))

    def reduce(self, ops, op, value, options, where):
        self.calls.append(("reduce", type(ops).__name__, op, options.timeout_seconds, where))
        return Boxed(ops.reduce_arrays(op, value.value, options))

    def batch_reduce(self, ops, op, values, options, where):
        self.calls.append(("batch_reduce", type(ops).__name__, op, len(values), where))
        return [Boxed(v.value if isinstance(v, Boxed) else v) for v in values]

    def broadcast(self, ops, value, root, where):
        self.calls.append(("broadcast", type(ops).__name__, root, where))
        return Boxed(ops.broadcast_arrays(value.value, root))


ADAPTER = BoxAdapter()
ops_lib.register_value_adapter(ADAPTER)
ops_lib.register_value_adapter(ADAPTER)  # twice: a no-op


def test_framework_values_go_to_their_adapter():
    ops = mpidist.NcclAllReduce(num_packs=2)
    options = mpidist.experimental.CommunicationOptions(timeout_seconds=30)
    out = ops.reduce("max", Boxed(np.arange(3.0)), options=options)
    assert isinstance(out, Boxed) and out.value.tolist() == [0.0, 1.0, 2.0]  # one rank: its own value
    assert ADAPTER.calls[-1] == ("reduce", "NcclAllReduce", mpidist.ReduceOp.MAX, 30, "NcclAllReduce.reduce")
    pairs = [(np.ones(2), None), (Boxed(np.zeros(1)), "/cpu:0")]
    assert len(ops.batch_reduce("sum", pairs)) == 2
    assert ADAPTER.calls[-1] == ("batch_reduce", "NcclAllReduce", mpidist.ReduceOp.SUM, 2, "NcclAllReduce.batch_reduce")
    assert mpidist.ReductionToOneDevice().broadcast(Boxed(np.ones(2)), root=0).value.tolist() == [1.0, 1.0]
    assert ADAPTER.calls[-1] == ("broadcast", "ReductionToOneDevice", 0, "ReductionToOneDevice.broadcast")


def test_numpy_values_do_not_reach_an_adapter():
    before = len(ADAPTER.calls)
    result = mpidist.HierarchicalCopyAllReduce().reduce("sum", np.arange(4))
    assert isinstance(result, np.ndarray) and result.tolist() == [0, 1, 2, 3]
    assert len(ADAPTER.calls) == before


def test_an_incomplete_adapter_is_refused():
    with pytest.raises(TypeError, match="register_value_adapter: `adapter` must have a `batch_reduce` method"):
        ops_lib.register_value_adapter(type("Half", (), {"handles": lambda s, v: False,
                                                          "reduce": lambda *a: None})())


def test_numpy_use_does_not_load_tensorflow():
    code = ("import sys, numpy as np, mpidist\n"
            "ops = mpidist.NcclAllReduce()\n"
            "assert ops.reduce('sum', np.ones(2)).tolist() == [1, 1]\n"
            "assert ops.batch_reduce('sum', [(np.ones(1), None)])[0].tolist() == [1]\n"
            "assert ops.broadcast(np.ones(1)).tolist() == [1]\n"
            "assert 'tensorflow' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
