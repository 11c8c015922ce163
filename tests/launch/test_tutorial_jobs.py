"""Programs written from TensorFlow's two multi-worker tutorials ("Custom training loop with Keras
and MultiWorkerMirroredStrategy", "Multi-worker training with Keras": training, model.save,
checkpoints, BackupAndRestore) and from Horovod's checkpointing (rank 0 alone saves), under real
mpirun at -n 2 and -n 3: they run to the end, files are where each rank expects them, and the
weights equal one process's (the same program at -n 1)."""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import tempfile

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
TIMEOUT = 900
_references: dict[tuple, str] = {}


def run_ok(mpirun, n, *args, env=None):
    job = mpirun(n, *args, timeout=TIMEOUT, env=env)
    assert job.returncode == 0, job.output[-4000:]
    assert sorted(re.findall(r"rank (\d+): finished", job.output)) == [str(r) for r in range(n)], job.output[-4000:]
    return job


def reference(mpirun, script, *runs, env=None):
    """The directory of the same program's runs at -n 1 (made once per module)."""
    key = (script, runs, tuple(sorted((env or {}).items())))
    if key not in _references:
        directory = tempfile.mkdtemp(prefix="mpidist-tutorial-ref-")
        for args in runs:
            run_ok(mpirun, 1, script, directory, *args, env=env)
        _references[key] = directory
    return _references[key]


def same_as(directory, expected, n, part="weights"):
    """Every rank's weights equal each other's exactly and one process's to float rounding."""
    ranks = [np.load(os.path.join(directory, f"{part}.{r}.npy")) for r in range(n)]
    for r in range(1, n):
        np.testing.assert_array_equal(ranks[r], ranks[0], err_msg=f"{part}: rank {r} differs from rank 0")
    np.testing.assert_allclose(ranks[0], np.load(os.path.join(expected, f"{part}.0.npy")), rtol=1e-4, atol=1e-5,
                               err_msg=f"{part}: differs from one process")


@pytest.mark.parametrize("n, save", [(3, "tutorial"), (2, "chief")])
def test_custom_loop_tutorial_saves_and_resumes(mpirun, tmp_path, n, save):
    """Two runs: epochs 0-1, then, restored from the latest checkpoint (saved, as the tutorial does,
    before `epoch` advanced: it says epoch 1 with every step done), epoch 2. ``tutorial``: every
    worker saves, non-chief workers into a directory of their own they delete; ``chief``: only the
    chief saves (``if strategy.extended.should_checkpoint``)."""
    expected = reference(mpirun, "tutorial_ctl.py", ("2", "tutorial"), ("3", "tutorial"))
    run_ok(mpirun, n, "tutorial_ctl.py", str(tmp_path), "2", save)
    resumed = run_ok(mpirun, n, "tutorial_ctl.py", str(tmp_path), "3", save)
    assert sorted(re.findall(r"rank (\d+): restored ckpt-2 at epoch 1", resumed.output)) == \
        [str(r) for r in range(n)], resumed.output[-3000:]
    same_as(str(tmp_path), expected, n)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint", "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
    assert not glob.glob(str(tmp_path / "workertemp_*" / "*"))  # the non-chief workers deleted theirs


def test_chief_alone_saving_sync_on_read_variables_is_an_error(mpirun, tmp_path):
    """A sync-on-read variable's saved value is its aggregate over every rank: a save on the chief
    alone cannot work, and says why instead of hanging."""
    job = mpirun(2, "tutorial_ctl.py", str(tmp_path), "2", "chief-sync-on-read", timeout=TIMEOUT)
    assert job.returncode != 0, job.output[-3000:]
    assert "every rank must make it" in job.output, job.output[-4000:]
    assert "finished" not in job.output


# what each Keras leaves: its BackupAndRestore files while interrupted (Keras 2: a CheckpointManager
# directory), whether the backup directory is left after training (Keras 2 removes only "chief"),
# and the parts of the program (Keras 2 has no chief_only part: see tutorial_keras.py)
KERASES = {
    "keras3": ({"TF_USE_LEGACY_KERAS": "0"}, r"\['latest.weights.h5', 'training_metadata.json'\]", "False",
               ("fit", "save", "checkpoint", "backup", "backup_steps", "chief_only")),
    "tf_keras": ({"TF_USE_LEGACY_KERAS": "1"}, r"\['chief'\]", "True",
                 ("fit", "save", "checkpoint", "backup", "backup_steps")),
}


@pytest.mark.parametrize("n, keras", [(3, "keras3"), (2, "tf_keras")])
def test_keras_tutorial_every_part(mpirun, tmp_path, n, keras):
    env, backup_files, backup_left, parts = KERASES[keras]
    if keras == "tf_keras" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed")
    expected = reference(mpirun, "tutorial_keras.py", (), env=env)
    job = run_ok(mpirun, n, "tutorial_keras.py", str(tmp_path), env=env)
    for part in parts:
        same_as(str(tmp_path), expected, n, part)
    assert sorted(re.findall(rf"rank (\d+): resumed epochs \[2, 3\]; backup left: {backup_left}", job.output)) == \
        [str(r) for r in range(n)], job.output[-3000:]
    assert sorted(re.findall(rf"rank (\d+): interrupted: Interrupting!; backup files {backup_files}", job.output)) == \
        [str(r) for r in range(n)], job.output[-3000:]
    assert not glob.glob(str(tmp_path / "workertemp_*" / "*"))
    assert not glob.glob(str(tmp_path / "backup" / "*"))  # removed once training ended
    assert len(glob.glob(str(tmp_path / "ckpt" / "*.index"))) == 1
    assert (tmp_path / "keras-model.keras").exists()
    assert (tmp_path / "chief-only.weights.h5").exists() == ("chief_only" in parts)
    assert not [f for f in glob.glob(str(tmp_path / "**"), recursive=True) if "mpidist-tmp" in f]


@pytest.mark.parametrize("n, variant", [(2, "plain"), (3, "strategy")])
def test_horovod_rank0_checkpoint_and_restore(mpirun, tmp_path, n, variant):
    """``if hvd.rank() == 0: checkpoint.save(...)``, with plain Keras objects or objects built under
    mpidist's strategy; a second run restores the latest checkpoint on every rank and goes on. The
    checkpoint holds the model, the optimizer (momentum, iterations) and the step, so the resumed job
    must end with the weights of one process trained without a break (one reference job, not two)."""
    expected = reference(mpirun, "horovod_checkpoint.py", ("3",))
    run_ok(mpirun, n, "horovod_checkpoint.py", str(tmp_path), "2", *([variant] if variant == "strategy" else []))
    resumed = run_ok(mpirun, n, "horovod_checkpoint.py", str(tmp_path), "3",
                     *([variant] if variant == "strategy" else []))
    assert sorted(re.findall(r"rank (\d+): restored ckpt-2 at step 8", resumed.output)) == \
        [str(r) for r in range(n)], resumed.output[-3000:]
    same_as(str(tmp_path), expected, n)
    assert sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "checkpoints" / "*.index"))) == \
        ["ckpt-1.index", "ckpt-2.index", "ckpt-3.index"]
