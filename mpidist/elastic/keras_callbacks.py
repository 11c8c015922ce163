"""Keras callbacks for ``model.fit`` inside ``mpidist.elastic.run`` (as Horovod's elastic ones).

``CommitStateCallback(state, batches_per_commit=1)`` keeps ``state.batch`` (the next batch of the
epoch to run) and commits every ``batches_per_commit`` batches; ``UpdateEpochStateCallback(state)``
sets ``state.epoch`` to the next epoch and ``state.batch`` to 0 at the end of each epoch and
commits. After a recovery, resume with ``initial_epoch=state.epoch`` and, when ``state.batch`` is
not 0, first finish that epoch on the data from batch ``state.batch`` on (``dataset.skip``)::

    @mpidist.elastic.run
    def train(state):
        callbacks = [CommitStateCallback(state), UpdateEpochStateCallback(state)]
        if state.batch:
            model.fit(epoch_data(state.epoch).skip(state.batch), initial_epoch=state.epoch,
                      epochs=state.epoch + 1, callbacks=callbacks)
        model.fit(..., initial_epoch=state.epoch, epochs=epochs, callbacks=callbacks)

The batch numbers Keras passes restart at 0 in each ``fit``; the callback counts from the batch
the epoch resumed at. The classes are built (and Keras imported) when first used.
"""
from __future__ import annotations

import functools
from typing import Any

from .state import State


def _check_state(name: str, state: Any) -> None:
    if not isinstance(state, State):
        raise TypeError(f"{name}: `state` must be an mpidist.elastic State, got {type(state).__name__}")


@functools.cache
def classes() -> dict[str, type]:
    """{"CommitStateCallback": ..., "UpdateEpochStateCallback": ...}: Keras callbacks (imports Keras)."""
    import keras

    class CommitStateCallback(keras.callbacks.Callback):
        """Sets ``state.batch`` after each batch and commits every ``batches_per_commit`` batches."""

        def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
            super().__init__()
            _check_state("CommitStateCallback", state)
            if not isinstance(batches_per_commit, int) or batches_per_commit < 1:
                raise ValueError(f"CommitStateCallback: `batches_per_commit` must be an int >= 1, "
                                 f"got {batches_per_commit!r}")
            self.state, self.batches_per_commit = state, batches_per_commit
            self.offset = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            # the batch this epoch starts at: the resumed one in the first epoch after a recovery, else 0
            self.offset = int(getattr(self.state, "batch", 0)) if epoch == getattr(self.state, "epoch", epoch) else 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.state.batch = self.offset + batch + 1
            if self.state.batch % self.batches_per_commit == 0:
                self.state.commit()

    class UpdateEpochStateCallback(keras.callbacks.Callback):
        """At the end of each epoch: ``state.epoch = epoch + 1``, ``state.batch = 0``, commit."""

        def __init__(self, state: Any) -> None:
            super().__init__()
            _check_state("UpdateEpochStateCallback", state)
            self.state = state

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.state.epoch = epoch + 1
            self.state.batch = 0
            self.state.commit()

    return {"CommitStateCallback": CommitStateCallback, "UpdateEpochStateCallback": UpdateEpochStateCallback}


def __getattr__(name: str) -> Any:
    if name in ("CommitStateCallback", "UpdateEpochStateCallback"):
        return classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
