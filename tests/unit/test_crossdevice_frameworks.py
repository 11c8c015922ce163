"""The public CrossDeviceOps classes (mpidist/cross_device_ops.py) hand framework values to the TensorFlow
layer (here a stand-in for mpidist.tensorflow.cross_device); NumPy values never go there and never
load TensorFlow; the cross-device layer itself takes arrays only and calls nothing above it."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mpidist
from mpidist import cross_device_ops as frameworks
from mpidist.cross_device import ops as ops_lib


class Boxed:
    def __init__(self, value):
        self.value = value


class BoxLayer:
    """Stands for mpidist.tensorflow.cross_device: takes nests holding a Boxed; records what it was
    asked to do."""

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


ADAPTER = BoxLayer()


@pytest.fixture(autouse=True)
def box_layer(monkeypatch):
    monkeypatch.setattr(frameworks, "_tf_values_state", [ADAPTER])  # as if TensorFlow were in use


def test_framework_values_go_to_the_framework_layer():
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


def test_numpy_values_do_not_reach_the_framework_layer():
    before = len(ADAPTER.calls)
    result = mpidist.HierarchicalCopyAllReduce().reduce("sum", np.arange(4))
    assert isinstance(result, np.ndarray) and result.tolist() == [0, 1, 2, 3]
    assert len(ADAPTER.calls) == before


def test_the_cross_device_layer_takes_arrays_only():
    """Below the public classes nothing reaches up for a framework: a foreign value is an error."""
    assert isinstance(mpidist.NcclAllReduce(), ops_lib.CrossDeviceOps)
    assert not hasattr(ops_lib, "NcclAllReduce")  # one NcclAllReduce: the public class
    before = len(ADAPTER.calls)
    with pytest.raises(TypeError, match="must be an array or a number"):
        ops_lib.CrossDeviceOps().reduce("sum", Boxed(np.ones(2)))
    assert len(ADAPTER.calls) == before


def test_numpy_use_does_not_load_tensorflow():
    code = ("import sys, numpy as np, mpidist\n"
            "ops = mpidist.NcclAllReduce()\n"
            "assert ops.reduce('sum', np.ones(2)).tolist() == [1, 1]\n"
            "assert ops.batch_reduce('sum', [(np.ones(1), None)])[0].tolist() == [1]\n"
            "assert ops.broadcast(np.ones(1)).tolist() == [1]\n"
            "assert 'tensorflow' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
