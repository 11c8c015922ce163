"""The strategy classes with TensorFlow imported: ``mpidist.X()`` returns mpidist's genuine
``tf.distribute.Strategy``, yet ``isinstance(s, mpidist.X)`` holds; ``mpidist.tensorflow.X`` always
builds on TensorFlow, ``mpidist.numpy.X`` never; ``close()`` and ``with`` free the communicators.
(The NumPy mode is tested in test_strategies.py, which imports no TensorFlow.)"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import mpidist  # noqa: E402
import mpidist.tensorflow  # noqa: E402
from mpidist.errors import CommunicatorBrokenError  # noqa: E402

pytestmark = pytest.mark.mpi
KINDS = [("MultiWorkerMirroredStrategy", lambda m: m.MultiWorkerMirroredStrategy),
         ("MirroredStrategy", lambda m: m.MirroredStrategy),
         ("OneDeviceStrategy", lambda m: m.OneDeviceStrategy),
         ("experimental.CentralStorageStrategy", lambda m: m.experimental.CentralStorageStrategy),
         ("experimental.MultiWorkerMirroredStrategy", lambda m: m.experimental.MultiWorkerMirroredStrategy)]
TF_KIND = {"MultiWorkerMirroredStrategy": "MultiWorkerMirroredStrategy", "MirroredStrategy": "MirroredStrategy",
           "OneDeviceStrategy": "OneDeviceStrategy", "experimental.CentralStorageStrategy": "CentralStorageStrategy",
           "experimental.MultiWorkerMirroredStrategy": "MultiWorkerMirroredStrategy"}


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
            for build in (cls_of(mpidist), cls_of(mpidist.tensorflow)):
                with build() as s:
                    assert isinstance(s, tf.distribute.Strategy) and s.kind == TF_KIND[name]
                    assert isinstance(s, cls_of(mpidist)) and isinstance(s, mpidist.Strategy)
                    assert isinstance(s, cls_of(mpidist.tensorflow)) and not isinstance(s, cls_of(mpidist.numpy))
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
        with mpidist.tensorflow.MultiWorkerMirroredStrategy() as s:
            assert isinstance(s, tf.distribute.Strategy) and isinstance(s, mpidist.MultiWorkerMirroredStrategy)


def test_numpy_classes_build_on_numpy_with_tensorflow_imported(comm):
    with mpidist.rc.override(framework="auto"):
        with mpidist.numpy.MultiWorkerMirroredStrategy() as s:
            assert not isinstance(s, tf.distribute.Strategy)
            assert isinstance(s, mpidist.MultiWorkerMirroredStrategy) and isinstance(s, mpidist.Strategy)
            assert not isinstance(s, mpidist.tensorflow.MultiWorkerMirroredStrategy)
            total = s.reduce("SUM", np.full(3, float(comm.Get_rank())), axis=None)
            np.testing.assert_array_equal(total, np.full(3, float(sum(range(comm.Get_size())))))


def test_close_frees_the_communicators_and_collectives_then_raise(comm):
    s = mpidist.tensorflow.MultiWorkerMirroredStrategy()
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
    with mpidist.tensorflow.MirroredStrategy() as s:
        assert s.reduce("MAX", tf.constant([1.0]), axis=None).numpy().tolist() == [1.0]
    assert s.engine.topology.comm is None
    with pytest.raises(CommunicatorBrokenError):
        s.reduce("SUM", tf.ones(1), axis=None)
