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

Launch with ``mpirun --with-ft ulfm --mca mpi_ft_detector true``; see docs/elastic.md. Nothing
here imports TensorFlow. (TensorFlowKerasState and the Keras callbacks of the issue are not built yet.)
"""
from .run import Recovery, recoveries, run, world_rank
from .state import ObjectState, State
from .ulfm import active as ulfm_active, status as ulfm_status

__all__ = ["State", "ObjectState", "run", "Recovery", "recoveries", "world_rank", "ulfm_active", "ulfm_status"]
