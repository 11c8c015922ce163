"""Keras 3, Keras 2 (tf_keras) and ``tf.train.Checkpoint`` under mpidist strategies: what one
process would do.

Installed when an mpidist TensorFlow strategy is built (``install()``: once, idempotent). Each
module patches one topic, each patch acting only for a model or checkpoint of a multi-rank mpidist
strategy (``owners.multi_rank``); anything else runs Keras's and TensorFlow's own code:

- ``predict``: ``model.predict`` returns every rank's rows, in input order, on every rank;
- ``callbacks``: ModelCheckpoint, BackupAndRestore, TensorBoard, CSVLogger write once (the
  chief), atomically, whether they run on every rank or on the chief alone;
- ``files``: ``model.save`` / ``save_weights`` (Keras's saving functions): each path written once,
  atomically, whichever ranks save;
- ``shuffle``: unseeded shuffles (``fit(shuffle=True)``, ``dataset.shuffle(n)``) agree across ranks;
- ``clipping``: ``clipnorm`` / ``global_clipnorm`` / ``clipvalue`` of Keras 3 optimizers clip the
  gradient summed over the replicas, as one process clips the global batch's;
- ``loss_scale``: dynamic loss scaling (``mixed_float16``) skips a step on every rank or on none;
- ``tf_checkpoint``: ``tf.train.Checkpoint.save`` / ``write``, ``CheckpointManager.save``, whichever
  ranks save (every rank to one path or to paths of their own, or the chief alone).
- ``xla``: ``jit_compile=True`` (and ``"auto"``): the train step compiled by XLA in two parts, the
  gradients' all-reduce between them (``mpidist.tensorflow.xla``); acts under mpidist strategies of
  any number of ranks.

``patching.installed()`` lists the patches in place. Keras 2 (tf_keras: ``tf.keras`` under
``TF_USE_LEGACY_KERAS=1``, or tf_keras imported by the program) gets ``predict``, ``shuffle``,
``files`` (its saving functions), ``xla`` and, of ``callbacks``, CSVLogger and BackupAndRestore (accepted
under mpidist's strategies); its own multi-worker code already keeps ModelCheckpoint and
TensorBoard writes to the chief (``extended.should_checkpoint``), and ``flavor`` tells which Keras
a program uses.
"""
from __future__ import annotations

import logging
import threading

from .. import patching

_log = logging.getLogger("mpidist")
_done = False
_lock = threading.Lock()  # strategies built in two threads at once: one installs, the other waits


def install(strategy=None) -> None:
    """Apply every patch (once). Needs TensorFlow; the Keras patches also need Keras 3.

    With ``strategy`` (each strategy built on TensorFlow passes itself; collective over its ranks), its ranks
    also agree on the seed of unseeded shuffles (``shuffle.register``).
    """
    with _lock:
        if not _done:
            _install()
    if strategy is not None:
        from . import shuffle
        shuffle.register(strategy)


def _install() -> None:
    global _done
    import sys

    from .. import preemption
    from . import flavor, tf_checkpoint
    tf_checkpoint.install()
    preemption.install()  # tf.distribute.experimental.PreemptionCheckpointHandler (mpidist/tensorflow/preemption.py)
    if flavor.is_keras2() or "tf_keras" in sys.modules:
        from . import callbacks, files, predict, shuffle
        files.install_keras2()
        callbacks.install_keras2()
        predict.install_keras2()
        shuffle.install_keras2()
        from . import xla
        xla.install_keras2()
    try:
        import keras
    except ImportError:  # TensorFlow without Keras: nothing more to patch
        _done = True
        return
    if not keras.__version__.startswith("3."):
        _log.warning("mpidist: Keras %s is not Keras 3; its integration is not installed", keras.__version__)
    else:
        from . import callbacks, clipping, files, loss_scale, predict, shuffle
        files.install()
        callbacks.install()
        predict.install()
        shuffle.install()
        clipping.install()
        loss_scale.install()
        from . import xla
        xla.install()
    _done = True


__all__ = ["install", "patching"]
