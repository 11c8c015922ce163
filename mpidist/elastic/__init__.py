"""Elastic training: the job survives the death of ranks (ULFM), no relaunch, no checkpoint read.

::

    strategy = mpidist.MultiWorkerMirroredStrategy()
    state = mpidist.elastic.ObjectState(strategy, step=0, w=w0)

    @mpidist.elastic.run
    def train(state):
        while state.step < steps:
            ...
            state.step += 1
            state.commit()

    train(state)
    mpidist.elastic.shutdown()   # after a recovery: skips MPI_Finalize, whose fence can hang

Launch with ``mpirun --with-ft ulfm --mca mpi_ft_detector true``; see docs/elastic.md. Nothing
here imports TensorFlow; TensorFlowKerasState (mpidist.elastic.keras_state) loads it when first used.
"""
from .preemption import Preemption, on_preemption, read_checkpoint
from .run import Recovery, recoveries, run, shutdown, world_rank
from .state import ObjectState, State
from .ulfm import active as ulfm_active
from .ulfm import status as ulfm_status


def __getattr__(name: str):
    if name == "TensorFlowKerasState":  # imports TensorFlow
        from .keras_state import TensorFlowKerasState
        return TensorFlowKerasState
    if name in ("CommitStateCallback", "UpdateEpochStateCallback"):  # import Keras
        from .keras_callbacks import classes
        return classes()[name]
    raise AttributeError(f"module 'mpidist.elastic' has no attribute {name!r}")


__all__ = ["TensorFlowKerasState", "CommitStateCallback", "UpdateEpochStateCallback", "State", "ObjectState", "run",
           "shutdown", "Recovery", "recoveries", "world_rank", "ulfm_active", "ulfm_status", "on_preemption",
           "Preemption", "read_checkpoint"]
