"""The tf.distribute-shaped API with NumPy only: TensorFlow must never be imported."""
import sys

import numpy as np

import mpidist

strategy = mpidist.MultiWorkerMirroredStrategy()
rank, size = strategy.extended.rank, strategy.num_replicas_in_sync
with strategy.scope():
    per_replica = strategy.run(lambda: np.full(3, rank, dtype=np.float32))
    total = strategy.reduce("SUM", per_replica, axis=None)
    mean = strategy.reduce("MEAN", np.arange(rank + 1.0), axis=0)
    grads = strategy.run(lambda: mpidist.get_replica_context().all_reduce(
        "mean", {"w": np.ones((4, 4)), "b": np.zeros(4)},
        options=mpidist.experimental.CommunicationOptions(bytes_per_pack=64)))
mirrored = mpidist.MirroredStrategy(cross_device_ops=mpidist.HierarchicalCopyAllReduce())
mirrored.reduce("SUM", np.ones(2), axis=None)
mpidist.experimental.CentralStorageStrategy().reduce("MAX", np.ones(1), axis=None)
mpidist.OneDeviceStrategy("/cpu:0").reduce("SUM", np.ones(1), axis=None)
mpidist.cluster_resolver.MPIClusterResolver().cluster_spec()
assert total.tolist() == [size * (size - 1) / 2] * 3, total
assert abs(float(mean) - sum(sum(range(r + 1)) for r in range(size)) / sum(r + 1 for r in range(size))) < 1e-12
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "cupy", "jax", "torch"))
assert not heavy, heavy
print(f"rank {rank}: numpy API ok, no tensorflow imported", flush=True)
