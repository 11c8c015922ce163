"""``python -m tools.compression_digits``: the digits example trained with and without compression.

Run under mpirun, e.g. ``mpirun -n 2 python -m tools.compression_digits`` (rank 0 prints). The
model, data, optimizer and batch are those of examples/keras_digits.py (Keras ``model.fit`` under
mpidist's MultiWorkerMirroredStrategy). One job trains it four times from the same seed:
compression off, off again (the run-to-run noise floor), float16 and bfloat16, each on a strategy
built with ``CommunicationOptions(compression=...)`` (``--via rc``: ``mpidist.rc.compression``
instead), and reports the final training loss, test loss and accuracy, and the largest absolute
difference of every weight against the first uncompressed run.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

RUNS = (("off", "none"), ("off, again", "none"), ("float16", "float16"), ("bfloat16", "bfloat16"))


def _data() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    return tuple(train_test_split(x, digits.target, test_size=0.25, random_state=0))


def _train(tf: Any, mpidist: Any, setting: str, via: str, data: tuple, epochs: int, batch: int) -> dict[str, Any]:
    from mpidist.cross_device.options import CommunicationOptions
    x_train, x_test, y_train, y_test = data
    options = CommunicationOptions(compression=setting) if via == "options" else None
    with mpidist.rc.override(compression=setting if via == "rc" else "none"):
        strategy = mpidist.MultiWorkerMirroredStrategy(communication_options=options)
        tf.keras.utils.set_random_seed(0)
        with strategy.scope():
            model = tf.keras.Sequential([
                tf.keras.Input(shape=(64,)),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dense(64, activation="relu"),
                tf.keras.layers.Dense(10),
            ])
            model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
        history = model.fit(x_train, y_train, batch_size=batch, epochs=epochs, shuffle=True, verbose=0)
        loss, accuracy = model.evaluate(x_test, y_test, batch_size=batch, verbose=0)
        weights = [np.array(w) for w in model.get_weights()]
        strategy.close()
    return {"train loss": float(history.history["loss"][-1]), "test loss": float(loss),
            "test accuracy": float(accuracy), "weights": weights}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compression_digits", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--via", choices=("options", "rc"), default="options",
                        help="CommunicationOptions(compression=) on the strategy (default) or rc.compression")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from mpi4py import MPI

    import mpidist

    tf.config.experimental.enable_op_determinism()
    data = _data()
    runs = {name: _train(tf, mpidist, setting, args.via, data, args.epochs, args.global_batch)
            for name, setting in RUNS}
    base = runs["off"]["weights"]
    rows: dict[str, dict[str, float]] = {}
    for name, run in runs.items():
        diffs = [float(np.max(np.abs(w - b))) if w.size else 0.0 for w, b in zip(run["weights"], base)]
        scale = max(float(np.max(np.abs(b))) for b in base)
        rows[name] = {"train loss": run["train loss"], "test loss": run["test loss"],
                      "test accuracy": run["test accuracy"], "max |w - w_off|": max(diffs),
                      "max |w - w_off| / max |w_off|": max(diffs) / scale}
    if MPI.COMM_WORLD.Get_rank() == 0:
        result = {"ranks": MPI.COMM_WORLD.Get_size(), "epochs": args.epochs, "via": args.via, "runs": rows}
        print(json.dumps(result, indent=1) if args.json else _table(result), flush=True)
    return 0


def _table(result: dict) -> str:
    lines = [f"digits example, {result['ranks']} ranks, {result['epochs']} epochs, compression via {result['via']}",
             f"  {'run':<12}{'train loss':>12}{'test loss':>12}{'test acc':>10}{'max|dw|':>12}{'rel':>10}"]
    for name, r in result["runs"].items():
        lines.append(f"  {name:<12}{r['train loss']:>12.5f}{r['test loss']:>12.5f}{r['test accuracy']:>10.4f}"
                     f"{r['max |w - w_off|']:>12.3e}{r['max |w - w_off| / max |w_off|']:>10.2e}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
