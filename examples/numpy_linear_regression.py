"""Data-parallel linear regression with NumPy only: the tf.distribute API without TensorFlow.

    mpirun -n 4 python examples/numpy_linear_regression.py [--examples 4000] [--epochs 30]

Every rank builds the same synthetic data set (seeded), the strategy hands each rank its block of
every global batch, gradients are averaged across ranks with the replica context's all_reduce, and
every rank applies the same update. The chief compares the result with NumPy's least squares on
the whole data set.
"""
from __future__ import annotations

import argparse
import logging

import numpy as np

import mpidist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger("example")

    strategy = mpidist.MultiWorkerMirroredStrategy()
    chief = strategy.extended.should_checkpoint
    rng = np.random.default_rng(0)  # the same data on every rank
    x = rng.normal(size=(args.examples, args.features))
    true_w = np.linspace(-1, 1, args.features)
    y = x @ true_w + 0.5 + 0.01 * rng.normal(size=args.examples)

    dataset = strategy.experimental_make_numpy_dataset({"x": x, "y": y})
    params = {"w": np.zeros(args.features), "b": np.zeros(())}

    def step(batch):
        err = batch["x"] @ params["w"] + params["b"] - batch["y"]  # local block of the global batch
        grads = {"w": batch["x"].T @ err, "b": err.sum(), "n": np.array(len(err), dtype=np.float64)}
        total = mpidist.get_replica_context().all_reduce("sum", grads)  # one collective for the nest
        return {"w": total["w"] / total["n"], "b": total["b"] / total["n"]}, float(total["n"])

    for epoch in range(args.epochs):
        seen = 0.0
        for batch in strategy.experimental_distribute_dataset(dataset.shuffle(epoch).batch(args.global_batch)):
            grads, n = strategy.run(step, args=(batch,))
            params = {k: params[k] - args.lr * grads[k] for k in params}
            seen += n
        if chief and (epoch + 1) % 10 == 0:
            mse = float(np.mean((x @ params["w"] + params["b"] - y) ** 2))
            log.info("epoch %d: %d examples, mse %.6f", epoch + 1, seen, mse)

    # every rank holds the same parameters: check it, then compare with least squares
    spread = strategy.reduce("MAX", params["w"], axis=None) - strategy.reduce("MIN", params["w"], axis=None)
    if chief:
        design = np.hstack([x, np.ones((args.examples, 1))])
        exact = np.linalg.lstsq(design, y, rcond=None)[0]
        gap = float(np.max(np.abs(np.append(params["w"], params["b"]) - exact)))
        log.info("ranks: %d; max difference between ranks: %.3g; max |w - lstsq|: %.3g",
                 strategy.num_replicas_in_sync, float(np.max(spread)), gap)


if __name__ == "__main__":
    main()
