"""model.predict under an mpidist strategy: every rank gets every row, in input order, equal to one
process's predict (NumPy input, datasets with a short last batch, several steps per execution)."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from reference import assert_float32_close  # noqa: E402

pytestmark = pytest.mark.mpi
GLOBAL_BATCH = 16


def build_model(steps_per_execution: int = 1):
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, {"logits": keras.layers.Dense(3)(hidden), "score": keras.layers.Dense(1)(hidden)})
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model


def reference_predict(comm, weights, x, steps_per_execution):
    """One process's predict (rank 0 computes it, every rank receives it)."""
    def single():
        model = build_model(steps_per_execution)
        model.set_weights(weights)
        return model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    return comm.bcast(single() if comm.Get_rank() == 0 else None, root=0)


@pytest.mark.parametrize("rows", [70, 66, 3])  # short last batches of 6, 2 (empty blocks at -n 4) and 3 rows
@pytest.mark.parametrize("data, steps_per_execution", [("numpy", 1), ("dataset", 1), ("distributed", 1),
                                                       ("numpy", 3)])
def test_predict_returns_all_rows_in_input_order(strategy, comm, rows, data, steps_per_execution):
    x = np.random.default_rng(rows).normal(size=(rows, 8)).astype(np.float32)
    with strategy.scope():
        model = build_model(steps_per_execution)
    if data == "numpy":
        got = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    else:
        ds = tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH)
        got = model.predict(strategy.experimental_distribute_dataset(ds) if data == "distributed" else ds, verbose=0)
    expected = reference_predict(comm, model.get_weights(), x, steps_per_execution)
    assert set(got) == {"logits", "score"}
    for key in expected:
        assert got[key].shape == expected[key].shape == (rows, 3 if key == "logits" else 1)
        assert_float32_close(got[key], expected[key])  # other batch shapes than one process's
    everyone = comm.allgather(got["logits"])
    for other in everyone[1:]:
        np.testing.assert_array_equal(other, everyone[0])


def test_predict_of_a_plain_output_and_predict_on_batch(strategy, comm):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    got = model.predict(x, batch_size=4, verbose=0)
    assert_float32_close(got, model(x).numpy())  # batches of 4 split over the ranks, against all 10 rows
    mine = x[comm.Get_rank():comm.Get_rank() + 2]  # each rank its own rows: not sharded, not gathered
    assert_float32_close(model.predict_on_batch(mine), model(mine).numpy())  # a tf.function against eager
    np.testing.assert_allclose(model.predict(x, batch_size=4, verbose=0), got)  # predict unaffected afterwards


def test_patches_are_listed(strategy):
    from mpidist.keras import patching
    listed = patching.installed()
    assert "keras.src.backend.tensorflow.trainer.reduce_per_replica" in listed
    assert any(name.endswith("ModelCheckpoint._save_model") for name in listed)
    assert any(name.endswith("Checkpoint.save") for name in listed)
