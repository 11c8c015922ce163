"""The layers check arguments with mpidist.validation: same rule, same message, everywhere."""
from __future__ import annotations

import numpy as np
import pytest

from mpidist import validation
from mpidist.cross_device_ops import HierarchicalCopyAllReduce, MPIAllReduce, NcclAllReduce
from mpidist.input.context import InputContext
from mpidist.input.numpy_dataset import NumpyDataset


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8", -4096])
def test_mpiallreduce_bytes_per_pack(bad):
    with pytest.raises(ValueError, match=f"^MPIAllReduce: `bytes_per_pack` must be an integer >= 0 or None, "
                                         f"got {bad!r}$"):
        MPIAllReduce(bad)


def test_mpiallreduce_bytes_per_pack_none_is_not_set_and_zero_automatic():
    assert MPIAllReduce().bytes_per_pack is None and MPIAllReduce(None).bytes_per_pack is None
    assert MPIAllReduce(0).bytes_per_pack == 0


@pytest.mark.parametrize("cls", [NcclAllReduce, HierarchicalCopyAllReduce])
@pytest.mark.parametrize("bad", [-1, 2.0, False])
def test_num_packs(cls, bad):
    with pytest.raises(ValueError, match=f"^{cls.__name__}: `num_packs` must be an integer >= 0, got {bad!r}$"):
        cls(bad)


def test_numpy_integers_are_integers_and_come_back_as_int():
    ops = MPIAllReduce(np.int64(4096))
    assert ops.bytes_per_pack == 4096 and type(ops.bytes_per_pack) is int
    assert type(NcclAllReduce(np.int32(2)).num_packs) is int


@pytest.mark.parametrize("low", [0, 1, 5])
def test_check_int_at_least(low):
    assert validation.check_int_at_least(low, "f", "n", low) == low
    assert validation.check_int_at_least(None, "f", "n", low, optional=True) is None
    with pytest.raises(ValueError, match=f"^f: `n` must be an integer >= {low}, got {low - 1}$"):
        validation.check_int_at_least(low - 1, "f", "n", low)
    with pytest.raises(ValueError, match=f"^f: `n` must be an integer >= {low} or None, got True$"):
        validation.check_int_at_least(True, "f", "n", low, optional=True)


def test_input_checks():
    with pytest.raises(ValueError, match="^InputContext: `num_input_pipelines` must be an integer >= 1, got 0$"):
        InputContext(0)
    with pytest.raises(ValueError, match="^InputContext: `input_pipeline_id` must be an integer >= 0, got -1$"):
        InputContext(2, -1)
    ctx = InputContext(1, 0, 4)
    assert ctx.get_per_replica_batch_size(np.int64(8)) == 2
    with pytest.raises(ValueError, match="^InputContext.get_per_replica_batch_size: `global_batch_size` must be "
                                         "an integer >= 0, got -4$"):
        ctx.get_per_replica_batch_size(-4)
    with pytest.raises(ValueError, match="^NumpyDataset.batch: `global_batch_size` must be an integer >= 1, got 0$"):
        NumpyDataset(np.arange(6)).batch(0)
    assert len(NumpyDataset(np.arange(6)).batch(np.int64(4))) == 2
