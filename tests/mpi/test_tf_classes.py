"""The strategy classes with TensorFlow imported: ``mpidist.X()`` builds its subclass
``mpidist.on_tensorflow.X``, mpidist's genuine ``tf.distribute.Strategy``, so ``isinstance(s, mpidist.X)``
holds by inheritance; ``mpidist.on_tensorflow.X`` always builds on TensorFlow, ``rc.framework="numpy"``
never; ``close()`` and ``with`` free the communicators. (The NumPy mode is tested in
test_strategies.py, which imports no TensorFlow.)"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import mpidist  # noqa: E402
import mpidist.on_tensorflow  # noqa: E402
import mpidist.tensorflow  # noqa: E402
from mpidist.errors import CommunicatorBrokenError  # noqa: E402

pytestmark = pytest.mark.mpi
KINDS = [("MultiWorkerMirroredStrategy", lambda m: m.MultiWorkerMirroredStrategy),
         ("MirroredStrategy", lambda m: m.MirroredStrategy),
         ("OneDeviceStrategy", lambda m: m.OneDeviceStrategy),
         ("experimental.CentralStorageStrategy", lambda m: m.experimental.CentralStorageStrategy),
         ("experimental.MultiWorkerMirroredStrategy", lambda m: m.experimental.MultiWorkerMirroredStrategy)]


def replicas(name: str, comm, s) -> int:
    if name == "OneDeviceStrategy":
        return 1
    if name == "MirroredStrategy":
        return s.engine.topology.size  # the ranks of this node
    return comm.Get_size()


@pytest.mark.node_layout  # MirroredStrategy: this node's ranks
@pytest.mark.parametrize("name, cls_of", KINDS, ids=[k[0] for k in KINDS])
def test_isinstance_holds_for_the_tensorflow_strategy(comm, name, cls_of):
    for framework in ("auto", "tensorflow"):
        with mpidist.rc.override(framework=framework):
            for build in (cls_of(mpidist), cls_of(mpidist.on_tensorflow)):
                with build() as s:
                    assert type(s) is cls_of(mpidist.on_tensorflow) and isinstance(s, tf.distribute.Strategy)
                    assert isinstance(s, cls_of(mpidist)) and isinstance(s, mpidist.Strategy)
                    assert issubclass(type(s), cls_of(mpidist)) and not s.closed
                    others = [c(mpidist) for n, c in KINDS if n != name and not (
                        name == "experimental.MultiWorkerMirroredStrategy" and n == "MultiWorkerMirroredStrategy")]
                    assert not any(isinstance(s, other) for other in others), (name, others)
                    n = replicas(name, comm, s)
                    assert s.num_replicas_in_sync == n
                    total = s.reduce("SUM", s.run(lambda: tf.ones(2)), axis=None)
                    np.testing.assert_array_equal(total.numpy(), np.full(2, float(n)))


def test_tensorflow_classes_build_on_tensorflow_even_when_rc_says_numpy(comm):
    with mpidist.rc.override(framework="numpy"):
        with mpidist.MultiWorkerMirroredStrategy() as plain:
            assert not isinstance(plain, tf.distribute.Strategy)
        with mpidist.on_tensorflow.MultiWorkerMirroredStrategy() as s:
            assert isinstance(s, tf.distribute.Strategy) and isinstance(s, mpidist.MultiWorkerMirroredStrategy)


def test_rc_numpy_builds_on_numpy_with_tensorflow_imported(comm):
    with mpidist.rc.override(framework="numpy"):
        with mpidist.MultiWorkerMirroredStrategy() as s:
            assert type(s) is mpidist.MultiWorkerMirroredStrategy and not isinstance(s, tf.distribute.Strategy)
            total = s.reduce("SUM", np.full(3, float(comm.Get_rank())), axis=None)
            np.testing.assert_array_equal(total, np.full(3, float(sum(range(comm.Get_size())))))


# What a TensorFlow class may take from the NumPy classes it derives from: its constructor's parts
FROM_NUMPY = {"_setup", "on_engine", "update_on_chief"}


@pytest.mark.parametrize("name, cls_of", KINDS, ids=[k[0] for k in KINDS])
def test_tensorflow_classes_take_nothing_else_from_the_numpy_implementation(name, cls_of):
    """mpidist.on_tensorflow.X derives from mpidist.X for isinstance and _setup; every other attribute
    must come from the TensorFlow side of its bases, or NumPy code would run on TensorFlow values."""
    tf_cls = cls_of(mpidist.on_tensorflow)
    numpy_side = [c for c in cls_of(mpidist).__mro__ if c is not object]
    taken = set()
    for attribute in dir(tf_cls):
        owner = next(c for c in tf_cls.__mro__ if attribute in vars(c))
        if owner in numpy_side:
            taken.add(attribute)
    assert taken <= FROM_NUMPY | {"__dict__", "__weakref__", "__module__", "__doc__"}, taken
    for hook in ("_assemble", "__init__", "__new__"):  # what both constructors end in is TensorFlow's
        owner = next(c for c in tf_cls.__mro__ if hook in vars(c))
        assert owner.__module__ == "mpidist.on_tensorflow", (hook, owner)


def test_copies_and_pickling_behave_as_for_a_plain_class(comm):
    import copy
    import pickle
    with mpidist.MultiWorkerMirroredStrategy() as s:
        twin = copy.deepcopy(s)
        assert type(twin) is type(s) is mpidist.on_tensorflow.MultiWorkerMirroredStrategy
        assert isinstance(twin, mpidist.MultiWorkerMirroredStrategy) and twin.engine is s.engine
        value = twin.reduce("SUM", tf.fill([2], float(comm.Get_rank())), axis=None)
        np.testing.assert_array_equal(value.numpy(), np.full(2, float(sum(range(comm.Get_size())))))
        with pytest.raises(TypeError, match="MultiWorkerMirroredStrategy: a strategy holds MPI communicators"):
            pickle.dumps(s)
        assert pickle.loads(pickle.dumps(type(s))) is type(s)
    assert twin.closed


def test_a_subclass_of_a_public_class_says_which_class_to_derive_from(comm):
    class Tagged(mpidist.MultiWorkerMirroredStrategy):
        pass

    with pytest.raises(TypeError, match="derive from mpidist.on_tensorflow.MultiWorkerMirroredStrategy"):
        Tagged()

    class TaggedTF(mpidist.on_tensorflow.MultiWorkerMirroredStrategy):
        pass

    with TaggedTF() as s:
        assert type(s) is TaggedTF and isinstance(s, mpidist.MultiWorkerMirroredStrategy)
        assert s.num_replicas_in_sync == comm.Get_size()


def test_close_frees_the_communicators_and_collectives_then_raise(comm):
    s = mpidist.on_tensorflow.MultiWorkerMirroredStrategy()
    value = s.reduce("SUM", tf.ones(2), axis=None)
    np.testing.assert_array_equal(value.numpy(), np.full(2, float(comm.Get_size())))
    s.close()
    assert s.engine.topology.comm is None and s.engine.broken is not None
    with pytest.raises(CommunicatorBrokenError, match="the engine was closed"):
        s.reduce("SUM", tf.ones(2), axis=None)
    with pytest.raises(CommunicatorBrokenError, match="the engine was closed"):
        s.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.ones(2)))
    s.close()  # a second close does nothing


@pytest.mark.node_layout  # MirroredStrategy: this node's ranks
def test_with_block_closes(comm):
    with mpidist.on_tensorflow.MirroredStrategy() as s:
        assert s.reduce("MAX", tf.constant([1.0]), axis=None).numpy().tolist() == [1.0]
    assert s.engine.topology.comm is None
    with pytest.raises(CommunicatorBrokenError):
        s.reduce("SUM", tf.ones(1), axis=None)
