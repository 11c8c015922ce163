"""Every replacement of a TensorFlow / Keras attribute goes through ``mpidist.tensorflow.patching``.

Each case runs a fresh interpreter (one rank; patches are process state) that imports TensorFlow and
Keras (Keras 3, or Keras 2 under ``TF_USE_LEGACY_KERAS=1``), records every attribute of every
module of ``tensorflow``, ``keras`` and ``tf_keras`` and of every class those modules define (its
functions, methods, classes and descriptors: what a patch replaces; not the state TensorFlow keeps
in module globals), then:

- imports ``mpidist``, ``mpidist.tensorflow`` (with its Keras patches) and ``mpidist.horovod.tensorflow``:
  nothing may change and the registry is empty (no patch at import);
- builds an mpidist strategy, then calls ``hvd.init()``: every attribute that changed (replaced,
  added or removed) must be listed by ``patching.installed()``, and every record must describe
  the attribute as it is now (the registered value in place, the original kept).

The same comparison, run on an attribute replaced behind the registry's back, reports it (the
check can fail). The registry's own rules (idempotent, thread-safe, a reason and the versions
checked required) are tested here too, on a throw-away class.
"""
from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
import threading
import types

import pytest

PREFIXES = ("tensorflow", "keras", "tf_keras")


def snapshot() -> dict[tuple[str, str], object]:
    """``(owner path, name) -> value`` for the attributes of the loaded TensorFlow/Keras modules and
    of the classes they define (submodules left out: importing one sets an attribute on its parent)."""
    found: dict[tuple[str, str], object] = {}
    for modname, module in list(sys.modules.items()):
        if module is None or modname.split(".")[0] not in PREFIXES:
            continue
        for name, value in list(vars(module).items()):
            if isinstance(value, types.ModuleType):
                continue
            found[(modname, name)] = value
            if isinstance(value, type) and value.__module__ == modname:
                for attr, member in list(vars(value).items()):
                    found[(f"{modname}.{value.__qualname__}", attr)] = member
    return found


def _code(value: object) -> bool:
    """What a patch replaces or adds: a function, method, class or descriptor (not the state TensorFlow
    keeps in module globals and changes itself, such as its eager context or a cache)."""
    return inspect.isroutine(value) or isinstance(value, (type, property, staticmethod, classmethod,
                                                          functools.partial))


def changed(before: dict, after: dict) -> list[str]:
    """``owner.name`` of every function, method, class or descriptor replaced, added or removed on an
    owner present before."""
    owners = {owner for owner, _ in before}
    out = set()
    missing = object()
    for key in before.keys() | after.keys():
        if key[0] not in owners:
            continue  # a module (or class) loaded since: nothing of it was replaced before it existed
        old, new = before.get(key, missing), after.get(key, missing)
        if old is not new and (_code(old) or _code(new)):
            out.add(f"{key[0]}.{key[1]}")
    return sorted(out)


def probe(flavor: str) -> None:
    """The check itself, in a fresh interpreter (see the module docstring)."""
    import keras  # noqa: F401
    import tensorflow as tf
    if flavor == "keras2":
        import tf_keras  # noqa: F401
    start = snapshot()

    import mpidist
    import mpidist.horovod.tensorflow as hvd
    import mpidist.on_tensorflow
    import mpidist.tensorflow
    import mpidist.tensorflow.keras
    from mpidist.tensorflow import patching
    assert changed(start, snapshot()) == [], changed(start, snapshot())
    assert patching.installed() == [], patching.installed()

    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy()
    after_strategy = changed(start, snapshot())
    assert after_strategy, "building a strategy installs the Keras patches"
    unlisted = set(after_strategy) - set(patching.installed())
    assert not unlisted, f"replaced outside mpidist.tensorflow.patching: {sorted(unlisted)}"

    hvd.init()
    now = snapshot()
    after_init = changed(start, now)
    unlisted = set(after_init) - set(patching.installed())
    assert not unlisted, f"replaced outside mpidist.tensorflow.patching: {sorted(unlisted)}"
    assert set(after_init) > set(after_strategy), "hvd.init() installs Horovod's patches"
    assert any(p.endswith("client.session.Session.run") for p in after_init), after_init
    for record in patching.records():  # each record tells the truth about the attribute
        assert record.reason and record.checked, record
        if record.kind != "adopt":
            assert getattr(record.owner, record.name) is not record.original, record.path
            assert patching.original(record.owner, record.name) is record.original, record.path

    # the comparison sees a replacement the registry did not make
    real = tf.random.uniform
    tf.random.uniform = lambda *args, **kwargs: real(*args, **kwargs)
    try:
        sneaked = set(changed(start, snapshot())) - set(patching.installed())
    finally:
        tf.random.uniform = real
    assert any(p.endswith(".uniform") for p in sneaked), sneaked
    strategy.close() if hasattr(strategy, "close") else None
    hvd.shutdown()
    print("PROBE OK", len(start), len(after_init), len(patching.installed()))


@pytest.mark.parametrize("flavor", ["keras3", "keras2"])
def test_every_changed_attribute_is_registered(flavor):
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras" if flavor == "keras2" else "keras")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_USE_LEGACY_KERAS", None)
    if flavor == "keras2":
        env["TF_USE_LEGACY_KERAS"] = "1"
    proc = subprocess.run([sys.executable, __file__, flavor], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "PROBE OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]


# -- the registry's own rules, on a throw-away class ---------------------------------------------

def _fresh_owner() -> type:
    class Owner:
        def method(self) -> str:
            return "original"
    return Owner


def _wrap(original):
    def method(self):
        return "patched:" + original(self)
    return method


def test_patch_is_recorded_once_with_reason_and_versions():
    from mpidist.tensorflow import patching
    owner = _fresh_owner()
    plain = owner.__dict__["method"]
    patching.patch(owner, "method", _wrap, reason="a test", checked="nothing")
    patching.patch(owner, "method", _wrap, reason="a test", checked="nothing")  # a second call does nothing
    assert owner().method() == "patched:original"
    assert patching.original(owner, "method") is plain
    mine = [r for r in patching.records() if r.owner is owner]
    assert [(r.name, r.reason, r.checked, r.kind) for r in mine] == [("method", "a test", "nothing", "wrap")]
    assert f"{owner.__module__}.{owner.__qualname__}.method" in patching.installed()


def test_patch_needs_a_reason_and_the_versions_checked():
    from mpidist.tensorflow import patching
    owner = _fresh_owner()
    with pytest.raises(ValueError, match="patching.patch: `reason` must say why"):
        patching.patch(owner, "method", _wrap, reason="", checked="x")
    with pytest.raises(ValueError, match="patching.replace: `checked` must name the versions"):
        patching.replace(owner, "method", None, reason="x", checked=" ")
    with pytest.raises(AttributeError, match="has no `missing` to wrap"):
        patching.patch(owner, "missing", _wrap, reason="x", checked="x")
    assert owner().method() == "original"


def test_concurrent_installs_wrap_once():
    from mpidist.tensorflow import patching
    owner = _fresh_owner()
    barrier = threading.Barrier(8)

    def install():
        barrier.wait()
        patching.patch(owner, "method", _wrap, reason="a test", checked="nothing")
    threads = [threading.Thread(target=install) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert owner().method() == "patched:original"  # wrapped once, not 8 times


def test_adopt_records_the_class_and_refuses_an_unrelated_one():
    from mpidist.tensorflow import patching
    owner = _fresh_owner()
    obj = owner()
    derived = type("Derived", (owner,), {"extra": lambda self: 1})
    assert patching.adopt(obj, derived, reason="a test", checked="nothing") is obj
    assert type(obj) is derived and obj.extra() == 1 and not hasattr(owner, "extra")
    assert f"{owner.__module__}.{owner.__qualname__}.__class__" in patching.installed()
    with pytest.raises(TypeError, match=r"patching.adopt: `subclass` must be a subclass of .*Owner, got <class .int.>"):
        patching.adopt(owner(), int, reason="a test", checked="nothing")


if __name__ == "__main__":
    probe(sys.argv[1])
