"""The framework choice: the public strategy classes, which build on TensorFlow when the program
uses it and on NumPy otherwise (the public CrossDeviceOps classes are in cross_device_ops.py).

This is the one place that knows both frameworks, so it sits in the top layer and imports the
layers below it the ordinary way; nothing below it knows which framework a program uses
(docs/design.md, "Layers" and "Strategies in two modes").

- The strategy classes, one per strategy (``mpidist.MultiWorkerMirroredStrategy``, ``MirroredStrategy``,
  ``OneDeviceStrategy``, ``experimental.CentralStorageStrategy``, ``experimental.MultiWorkerMirroredStrategy``):
  with TensorFlow in use (:func:`tensorflow_in_use`) a call builds their subclass
  ``mpidist.on_tensorflow.X`` (a genuine ``tf.distribute.Strategy``), otherwise the class itself, on
  NumPy (:func:`strategy_class`). Plain classes: ``isinstance`` and ``type`` answer by inheritance.
"""
from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from . import cross_device as _cd
from . import strategies as _strategies
from ._config import rc
from .collectives import Engine
from .strategies import parts

_log = logging.getLogger("mpidist")


def tensorflow_in_use() -> bool:
    """Whether the public strategy classes build on TensorFlow: ``rc.framework``; "auto" means
    TensorFlow is already imported ("tensorflow" imports it)."""
    if rc.framework == "auto":
        return "tensorflow" in sys.modules
    if rc.framework == "tensorflow":
        importlib.import_module("tensorflow")  # the framework itself, not an mpidist module
        return True
    return False


def strategy_class(cls: type) -> type:
    """The class a call of the public strategy class ``cls`` builds: ``cls`` itself (NumPy), or, with
    TensorFlow in use, its subclass ``mpidist.on_tensorflow.X`` (:func:`tensorflow_classes`). A
    program's own subclass of a public class builds on NumPy only: a TypeError says what to do."""
    if not tensorflow_in_use():
        return cls
    classes = tensorflow_classes()
    found = classes.get(cls)
    if found is None:
        public = next(c for c in cls.__mro__ if c in classes)
        raise TypeError(f"{cls.__name__}: a subclass of mpidist.{public.__name__} builds on NumPy only; with "
                        f"TensorFlow in use derive from mpidist.on_tensorflow.{public.__name__} instead (or set "
                        f"mpidist.rc.framework = \"numpy\")")
    return found


class _PublicStrategy(_strategies.Strategy):
    """The base of the public strategy classes: a call builds the class :func:`strategy_class` chooses
    (this one or its TensorFlow subclass) from ``_setup``'s parts (strategies/parts.py), and ends in
    the hook ``_assemble``, which each implementation defines."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # the class chosen derives from cls, so Python then calls its __init__ with the same arguments
        return object.__new__(strategy_class(cls))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._assemble(*self._setup(*args, **kwargs))

    @classmethod
    def on_engine(cls, engine: Engine, options: Any = None, *, devices: Any = None,
                  cross_device_ops: Any = None, cluster_resolver: Any = None) -> Any:
        """This strategy on an existing ``engine`` (over a communicator of the caller's: a sub-communicator,
        or a test's instrumented engine) instead of one built from the constructor's arguments; closing
        the strategy closes the engine. Built on NumPy or TensorFlow as a call of the class is."""
        self = cls.__new__(cls)  # the strategy being built: its own hook, as in __init__
        self._assemble(engine, _cd.as_options(options, f"{cls.__name__}.on_engine"), cross_device_ops,
                       cluster_resolver, {"devices": devices})
        return self

    @classmethod
    def _setup(cls, *args: Any, **kwargs: Any) -> parts.Parts:
        raise NotImplementedError

    def _assemble(self, engine: Engine, options: _cd.CommunicationOptions, cross_device_ops: Any,
                  cluster_resolver: Any, extra: dict[str, Any]) -> None:
        """Make this object the strategy of these parts: NumPy's here; the TensorFlow classes override it."""
        _strategies.Strategy.__init__(self, engine, options, cross_device_ops, cluster_resolver)


class MultiWorkerMirroredStrategy(_PublicStrategy):
    """Synchronous data parallelism over every rank of ``comm`` (default COMM_WORLD).

    ``MultiWorkerMirroredStrategy(cluster_resolver=None, communication_options=None, *, comm=None)``.
    """

    @classmethod
    def _setup(cls, cluster_resolver: Any = None, communication_options: Any = None, *,
               comm: Any = None) -> parts.Parts:
        return parts.multi_worker(cls.__name__, cluster_resolver, communication_options, comm)


class ExperimentalMultiWorkerMirroredStrategy(MultiWorkerMirroredStrategy):
    """``tf.distribute.experimental.MultiWorkerMirroredStrategy(communication=AUTO, cluster_resolver=None,
    communication_options=None)``, plus ``comm=``."""

    # TensorFlow's experimental class takes `communication` first, and isinstance(s, MWMS) must hold:
    # a subclass with another constructor signature, on purpose
    @classmethod
    def _setup(cls, communication: Any = _cd.CommunicationImplementation.AUTO,  # type: ignore[override]
               cluster_resolver: Any = None, communication_options: Any = None, *, comm: Any = None) -> parts.Parts:
        return parts.multi_worker(cls.__name__, cluster_resolver, communication_options, comm, communication)


class MirroredStrategy(_PublicStrategy):
    """Synchronous data parallelism over the ranks of this node (one replica per rank).

    ``MirroredStrategy(devices=None, cross_device_ops=None, *, comm=None)``: the replicas are the ranks
    of ``comm`` (default COMM_WORLD) that share this node. ``devices`` may name at most one device:
    launch one rank per device.
    """

    @classmethod
    def _setup(cls, devices: Any = None, cross_device_ops: Any = None, *, comm: Any = None) -> parts.Parts:
        return parts.mirrored(cls.__name__, devices, cross_device_ops, comm)


class OneDeviceStrategy(_PublicStrategy):
    """One replica on this rank alone: no communication. ``OneDeviceStrategy(device)``."""

    @classmethod
    def _setup(cls, device: Any = None) -> parts.Parts:
        return parts.one_device(cls.__name__, device)

    @classmethod
    def on_engine(cls, engine: Engine, options: Any = None, **kwargs: Any) -> Any:
        if getattr(engine, "size", 1) != 1:
            raise ValueError(f"{cls.__name__}.on_engine: `engine` must span one rank (an Engine over "
                             f"MPI.COMM_SELF), got one over {engine.size} ranks")
        return super().on_engine(engine, options, **kwargs)


class CentralStorageStrategy(_PublicStrategy):
    """``tf.distribute.experimental.CentralStorageStrategy(compute_devices=None, parameter_device=None)``,
    plus ``comm=``: replicas are the ranks; variables and their updates live on the chief (rank 0)."""

    update_on_chief = True

    @classmethod
    def _setup(cls, compute_devices: Any = None, parameter_device: Any = None, *, comm: Any = None) -> parts.Parts:
        return parts.central_storage(cls.__name__, compute_devices, parameter_device, comm)


_tensorflow_classes: dict[type, type] = {}


def tensorflow_classes() -> dict[type, type]:
    """Each public strategy class -> its subclass on TensorFlow, defined on the first call (which
    imports TensorFlow) and the same afterwards. Each derives from ``MPIStrategy`` (mpidist's
    genuine ``tf.distribute.Strategy``) and from its public class, whose ``_setup`` builds the parts;
    it lives in ``mpidist.on_tensorflow`` (its ``__module__``), so the class pickles by name."""
    if _tensorflow_classes:
        return _tensorflow_classes
    from .tensorflow import keras as keras_patches  # the integration: imports TensorFlow
    from .tensorflow.strategy import MPIStrategy

    class _OnTensorFlow(MPIStrategy):
        """What each class adds to MPIStrategy: its public class's constructor (MPIStrategy.__init__,
        nearer in the MRO, takes built parts), no framework choice, and ``_assemble`` with
        ``mpidist.tensorflow.keras`` installed (collective: the ranks agree on shuffle seeds)."""

        __module__ = "mpidist.on_tensorflow"

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            return object.__new__(cls)

        __init__ = _PublicStrategy.__init__  # MPIStrategy.__init__, nearer in the MRO, takes built parts

        def _assemble(self, engine: Any, options: Any, cross_device_ops: Any, cluster_resolver: Any,
                      extra: dict[str, Any]) -> None:
            super()._assemble(engine, options, cross_device_ops, cluster_resolver, extra)
            keras_patches.install(self)

    def derive(public: type, base: type) -> type:
        namespace = {"__module__": "mpidist.on_tensorflow", "__qualname__": public.__name__, "__doc__": public.__doc__}
        return type(public.__name__, (base, public), namespace)

    public = (MultiWorkerMirroredStrategy, MirroredStrategy, OneDeviceStrategy, CentralStorageStrategy)
    found: dict[type, type] = {cls: derive(cls, _OnTensorFlow) for cls in public}
    # as in TensorFlow, the experimental class is a MultiWorkerMirroredStrategy on TensorFlow too
    found[ExperimentalMultiWorkerMirroredStrategy] = derive(ExperimentalMultiWorkerMirroredStrategy,
                                                            found[MultiWorkerMirroredStrategy])
    _tensorflow_classes.update(found)
    return _tensorflow_classes


__all__ = ["tensorflow_in_use", "strategy_class", "tensorflow_classes", "MultiWorkerMirroredStrategy",
           "MirroredStrategy", "OneDeviceStrategy", "CentralStorageStrategy", "ExperimentalMultiWorkerMirroredStrategy"]
