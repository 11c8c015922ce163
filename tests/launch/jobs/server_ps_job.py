"""TensorFlow's own ParameterServerStrategy + ClusterCoordinator from one mpirun, no TF_CONFIG.

Usage: server_ps_job.py NUM_PS [MODE]. MPIClusterResolver(ps=NUM_PS, host="127.0.0.1"): ranks
0..NUM_PS-1 serve as "ps", rank NUM_PS is the chief, the rest serve as "worker"s; all traffic stays
on loopback. The chief trains a linear model with SGD, one scheduled step at a time (so the
result is deterministic), and checks the variables on the parameter servers against the same steps
done in NumPy. Every rank prints "rank R (TYPE) exits" last. MODE "chief-fails": the chief raises
after the first step; the job must end (non-zero) instead of hanging.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver

NUM_PS = int(sys.argv[1])
MODE = sys.argv[2] if len(sys.argv) > 2 else "train"
STEPS, LR = 6, 0.1
X = np.random.default_rng(0).integers(-3, 4, size=(16, 3)).astype(np.float32)
Y = X @ np.array([1.0, -2.0, 0.5], np.float32) + 0.25


def reference():
    """The same SGD steps in one process, in float64: (w, b, losses)."""
    w, b, losses = np.zeros(3), 0.0, []
    x, y = X.astype(np.float64), Y.astype(np.float64)
    for _ in range(STEPS):
        err = x @ w + b - y
        losses.append(float(np.mean(err ** 2)))
        w, b = w - LR * 2 * x.T @ err / len(y), b - LR * 2 * float(np.mean(err))
    return w, b, losses


def chief(resolver):
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.zeros([3]), name="w")
        b = tf.Variable(0.0, name="b")
    devices = [w.device, b.device]
    assert all("/job:ps/" in d for d in devices), devices
    assert len({tf.DeviceSpec.from_string(d).task for d in devices}) == min(NUM_PS, 2), devices

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.linalg.matvec(X, w) + b - Y) ** 2)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(LR * gw)
        b.assign_sub(LR * gb)
        return loss

    losses = []
    for i in range(STEPS):
        result = coordinator.schedule(step)
        coordinator.join()  # one step at a time: the same order of updates as one process
        losses.append(float(result.fetch()))
        if MODE == "chief-fails" and i == 0:
            raise RuntimeError("the chief fails on purpose")
    ref_w, ref_b, ref_losses = reference()
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), ref_b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert all(a > c for a, c in zip(losses, losses[1:])), losses
    print(f"chief: PS variables match the reference after {STEPS} steps; loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}", flush=True)
    resolver.shutdown()


def main():
    assert "TF_CONFIG" not in os.environ
    resolver = MPIClusterResolver(ps=NUM_PS, host="127.0.0.1")
    rank = resolver.comm.Get_rank()
    spec = resolver.cluster_spec().as_dict()
    addresses = [a for job in spec.values() for a in job]
    assert all(a.startswith("127.0.0.1:") for a in addresses), spec
    print(f"rank {rank} is {resolver.task_type}:{resolver.task_id} in {sorted((j, len(a)) for j, a in spec.items())}",
          flush=True)
    if resolver.serving:
        server = mpidist.Server(resolver)
        server.join()
        print(f"rank {rank} left join", flush=True)
    else:
        chief(resolver)
    print(f"rank {rank} ({resolver.task_type}) exits", flush=True)


if __name__ == "__main__":
    main()
