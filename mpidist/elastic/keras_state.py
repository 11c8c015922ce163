"""TensorFlow / Keras state for ``mpidist.elastic.run``: a model's weights, its optimizer's
variables and any attributes (``epoch``, ``batch`` ...), committed in memory as NumPy copies.
Importing this module imports TensorFlow."""
from __future__ import annotations

import copy
from typing import Any

from .state import State


class TensorFlowKerasState(State):
    """``TensorFlowKerasState(strategy, model, optimizer=None, epoch=0, batch=0, **more)``.

    A commit copies ``model.get_weights()`` and the optimizer's variables (once they exist) to
    host memory; restore and sync assign them back. The other keyword arguments are attributes,
    committed with it, as in :class:`~mpidist.elastic.ObjectState`.
    """

    _model: Any  # set with object.__setattr__: not committed attributes
    _optimizer: Any

    def __init__(self, strategy: Any, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("epoch", 0)
        kwargs.setdefault("batch", 0)
        object.__setattr__(self, "_model", model)
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        object.__setattr__(self, "_optimizer", optimizer)
        super().__init__(strategy, **kwargs)

    @property
    def model(self) -> Any:
        return self._model

    @property
    def optimizer(self) -> Any:
        return self._optimizer

    def save(self) -> Any:
        optimizer = [v.numpy().copy() for v in self._optimizer.variables] if self._optimizer is not None else []
        return {"attributes": self.attributes(), "weights": [w.copy() for w in self._model.get_weights()],
                "optimizer": optimizer}

    def on_reset(self) -> None:
        """After a recovery: drop the model's compiled train/test/predict functions (traced for the old
        replica count; the next ``fit`` builds new ones), then call the reset callbacks."""
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(self._model, name, None) is not None:
                setattr(self._model, name, None)
        super().on_reset()

    def load(self, snapshot: Any) -> None:
        State.load(self, snapshot["attributes"])
        self._model.set_weights(copy.deepcopy(snapshot["weights"]))
        if self._optimizer is not None and snapshot["optimizer"]:
            variables = self._optimizer.variables
            if len(variables) != len(snapshot["optimizer"]):
                raise ValueError(f"TensorFlowKerasState.load: the optimizer has {len(variables)} variables, the "
                                 f"snapshot {len(snapshot['optimizer'])}; build the optimizer before the first commit")
            for variable, value in zip(variables, snapshot["optimizer"]):
                variable.assign(value)
