"""Horovod's examples/tensorflow2/tensorflow2_mnist.py, on synthetic data: a custom training loop
with hvd.DistributedGradientTape, whose only mpidist line is the import. Runs with Keras 3 or,
under TF_USE_LEGACY_KERAS=1, Keras 2 (tf_keras).

    mpirun -n 4 python hvd_tf2_mnist.py OUT_DIR

Where it differs from Horovod's example, and why:
- synthetic_mnist.data() instead of a download, sharded by rank instead of shuffled per rank, and
  no Dropout: so that N ranks equal one process on the global batch (the launch test checks that);
- ``opt.variables`` instead of ``opt.variables()``: Keras 3's is a list; tf_keras's, a list that
  can also be called.
Rank 0 writes the final weights to OUT_DIR/weights.npz (and a tf.train.Checkpoint, as the example);
every rank prints a checksum of them.
"""
import os
import sys

import numpy as np
import tensorflow as tf

import mpidist.horovod.tensorflow as hvd  # was: import horovod.tensorflow as hvd
from synthetic_mnist import BATCH, TF2_STEPS as STEPS, checksum, data, model


def main(out_dir):
    hvd.init()
    images, labels = data()
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.shard(hvd.size(), hvd.rank()).repeat().batch(BATCH)

    mnist_model = model(tf.keras)
    loss = tf.losses.SparseCategoricalCrossentropy()
    # Horovod: adjust learning rate based on number of workers.
    opt = tf.optimizers.Adam(0.001 * hvd.size())

    checkpoint_dir = os.path.join(out_dir, "checkpoints")
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: add Horovod Distributed GradientTape.
        tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes, after the
        # first gradient step so that the optimizer's variables exist.
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss_value

    # Horovod: adjust number of steps based on number of workers.
    for batch, (images, labels) in enumerate(dataset.take(STEPS // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)
        if batch % 4 == 0 and hvd.local_rank() == 0:
            print("Step #%d\tLoss: %.6f" % (batch, loss_value), flush=True)

    weights = mnist_model.get_weights()
    print(f"rank {hvd.rank()}: weights checksum {checksum(weights)}", flush=True)
    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting it.
    if hvd.rank() == 0:
        checkpoint.save(checkpoint_dir)
        np.savez(os.path.join(out_dir, "weights.npz"), *weights)


if __name__ == "__main__":
    main(sys.argv[1])
