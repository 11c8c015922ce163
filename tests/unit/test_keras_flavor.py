"""mpidist.tensorflow.keras.flavor: which Keras a module is, Keras 2 optimizer kinds, optimizer variables (no
TensorFlow import: stand-in modules and classes)."""
from __future__ import annotations

import sys
import types

import pytest

from mpidist.tensorflow.keras import flavor


def test_major_version_from_the_module_or_its_package(monkeypatch):
    assert flavor.major_version(types.SimpleNamespace(__version__="3.15.1", __name__="keras._tf_keras.keras")) == 3
    # tf.keras under TF_USE_LEGACY_KERAS=1 is tf_keras.api._v2.keras, which has no __version__ of its own
    monkeypatch.setitem(sys.modules, "tf_keras", types.SimpleNamespace(__version__="2.21.0"))
    assert flavor.major_version(types.SimpleNamespace(__name__="tf_keras.api._v2.keras")) == 2


def _fake_tf_keras(monkeypatch):
    class Optimizer:  # tf_keras's current base
        pass

    class OptimizerV2:  # the legacy base
        pass

    module = types.SimpleNamespace(__version__="2.21.0", optimizers=types.SimpleNamespace(
        Optimizer=Optimizer, legacy=types.SimpleNamespace(Optimizer=OptimizerV2)))
    monkeypatch.setitem(sys.modules, "tf_keras", module)
    return Optimizer, OptimizerV2


def test_keras2_optimizer_kind_by_class(monkeypatch):
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    assert flavor.keras2_optimizer_kind(object()) is None  # tf_keras not imported: nothing is Keras 2
    current, legacy = _fake_tf_keras(monkeypatch)
    assert flavor.keras2_optimizer_kind(type("SGD", (current,), {})()) == "current"
    assert flavor.keras2_optimizer_kind(type("SGD", (legacy,), {})()) == "legacy"
    assert flavor.keras2_optimizer_kind(object()) is None


class _CallableList(list):
    def __call__(self):
        return self


@pytest.mark.parametrize("make", [
    lambda vs: types.SimpleNamespace(variables=vs),  # Keras 3: a property
    lambda vs: types.SimpleNamespace(variables=_CallableList(vs)),  # tf_keras's current optimizers
    lambda vs: types.SimpleNamespace(variables=lambda: vs),  # legacy OptimizerV2: a method
], ids=["keras3", "tf_keras", "legacy"])
def test_optimizer_variables_property_or_method(make):
    assert flavor.optimizer_variables(make(["a", "b"])) == ["a", "b"]
