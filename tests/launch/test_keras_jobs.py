"""Keras jobs under real mpirun: a job that fails after epoch k and is launched again with the same
BackupAndRestore directory resumes at epoch k+1 on every rank and ends with the weights of a job
that was never interrupted; under Keras 3 and under Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1)."""
from __future__ import annotations

import glob
import importlib.util
import re

import numpy as np
import pytest

pytest.importorskip("tensorflow")


def epochs_run(output: str, ranks: int, every_rank: bool = True) -> set:
    found = dict(re.findall(r"rank (\d+): epochs run (\[[\d, ]*\])", output))
    if every_rank:
        assert sorted(found) == [str(r) for r in range(ranks)], output
    else:  # a failing job aborts: ranks killed by the abort print nothing
        assert found and set(found) <= {str(r) for r in range(ranks)}, output
    return set(found.values())


KERASES = {"keras3": {"TF_USE_LEGACY_KERAS": "0"}, "tf_keras": {"TF_USE_LEGACY_KERAS": "1"}}


@pytest.mark.parametrize("ranks, keras", [(3, "keras3"), (3, "tf_keras")])  # uneven blocks: 16-row batches
def test_backup_and_restore_resumes_a_failed_job(tmp_path, mpirun, ranks, keras):
    if keras == "tf_keras" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed")
    env = KERASES[keras]
    backup = str(tmp_path / "backup")
    # the failing job first trains the same model uninterrupted (its own backup directory): the
    # weights of a job that was never interrupted, without a third launch of 3 ranks
    failed = mpirun(ranks, "keras_backup_job.py", backup, str(tmp_path / "straight.npz"), "fail-after-epoch", "2",
                    str(tmp_path / "other"), timeout=300, env=env)
    assert failed.returncode != 0, failed.output
    assert "injected failure after epoch 2" in failed.output
    straight = dict(re.findall(r"rank (\d+): straight epochs run (\[[\d, ]*\])", failed.output))
    assert straight == {str(r): "[0, 1, 2, 3, 4]" for r in range(ranks)}, failed.output
    assert epochs_run(failed.output, ranks, every_rank=False) == {"[0, 1, 2]"}
    resumed = mpirun(ranks, "keras_backup_job.py", backup, str(tmp_path / "resumed.npz"), "run", timeout=300,
                     env=env)
    assert resumed.returncode == 0, resumed.output
    assert epochs_run(resumed.output, ranks) == {"[3, 4]"}  # every rank resumed at epoch 3
    got, expected = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "straight.npz")
    assert len(got.files) == len(expected.files) == 4
    for name in expected.files:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7)
    assert not glob.glob(str(tmp_path / "backup" / "*"))  # deleted once training ended (tf_keras: its contents)
    assert not glob.glob(str(tmp_path / "other" / "*"))  # the uninterrupted fit's too
