"""InputContext, InputOptions and InputReplicationMode, as in ``tf.distribute``.

With one replica per rank there is one input pipeline per rank: ``num_input_pipelines`` is the
number of ranks and ``input_pipeline_id`` this rank.
"""
from __future__ import annotations

import enum
from typing import Any

from ..validation import check_int_at_least, check_nonneg_int


class InputReplicationMode(enum.Enum):
    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


class InputContext:
    """What ``distribute_datasets_from_function`` passes to the dataset function."""

    def __init__(self, num_input_pipelines: int = 1, input_pipeline_id: int = 0,
                 num_replicas_in_sync: int = 1) -> None:
        for name, value, low in (("num_input_pipelines", num_input_pipelines, 1),
                                 ("input_pipeline_id", input_pipeline_id, 0),
                                 ("num_replicas_in_sync", num_replicas_in_sync, 1)):
            check_int_at_least(value, "InputContext", name, low)
        if input_pipeline_id >= num_input_pipelines:
            raise ValueError(f"InputContext: `input_pipeline_id` must be < num_input_pipelines "
                             f"({num_input_pipelines}), got {input_pipeline_id}")
        self._num_input_pipelines = num_input_pipelines
        self._input_pipeline_id = input_pipeline_id
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def num_input_pipelines(self) -> int:
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size`` divided by the number of replicas; ValueError when it does not divide."""
        global_batch_size = check_nonneg_int(global_batch_size, "InputContext.get_per_replica_batch_size",
                                             "global_batch_size")
        if global_batch_size % self._num_replicas_in_sync:
            raise ValueError(f"InputContext.get_per_replica_batch_size: `global_batch_size` "
                             f"{global_batch_size} is not divisible by num_replicas_in_sync "
                             f"{self._num_replicas_in_sync}")
        return global_batch_size // self._num_replicas_in_sync

    def __repr__(self) -> str:
        return (f"InputContext(num_input_pipelines={self._num_input_pipelines}, input_pipeline_id="
                f"{self._input_pipeline_id}, num_replicas_in_sync={self._num_replicas_in_sync})")


class InputOptions:
    """``tf.distribute.InputOptions``: accepted for compatibility; host (NumPy) input is not prefetched
    to devices, and each rank has one replica, so PER_WORKER and PER_REPLICA behave alike."""

    def __init__(self, experimental_fetch_to_device: bool | None = None,
                 experimental_replication_mode: Any = InputReplicationMode.PER_WORKER,
                 experimental_place_dataset_on_device: bool = False,
                 experimental_per_replica_buffer_size: int = 1) -> None:
        if not isinstance(experimental_replication_mode, InputReplicationMode):
            name = getattr(experimental_replication_mode, "name", experimental_replication_mode)
            if name not in InputReplicationMode.__members__:
                raise ValueError(f"InputOptions: `experimental_replication_mode` must be PER_WORKER or "
                                 f"PER_REPLICA, got {experimental_replication_mode!r}")
            experimental_replication_mode = InputReplicationMode[name]
        if experimental_place_dataset_on_device and experimental_fetch_to_device:
            raise ValueError("InputOptions: `experimental_place_dataset_on_device` and "
                             "`experimental_fetch_to_device` cannot both be True")
        self.experimental_fetch_to_device = experimental_fetch_to_device
        self.experimental_replication_mode = experimental_replication_mode
        self.experimental_place_dataset_on_device = experimental_place_dataset_on_device
        self.experimental_per_replica_buffer_size = experimental_per_replica_buffer_size
