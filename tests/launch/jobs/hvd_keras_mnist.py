"""Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py, on synthetic data: a Keras ``fit``
with hvd.DistributedOptimizer and Horovod's callbacks, whose only mpidist line is the import.
Runs with Keras 3 or, under TF_USE_LEGACY_KERAS=1, Keras 2 (tf_keras).

    mpirun -n 4 python hvd_keras_mnist.py OUT_DIR

Where it differs from Horovod's example, and why:
- synthetic_mnist.data() instead of a download, sharded by rank instead of shuffled per rank, and
  no Dropout: so that N ranks equal one process on the global batch (the launch test checks that);
- ``compile`` without ``experimental_run_tf_function=False``: Keras 2 ignores that argument since
  TensorFlow 2.2, Keras 3 rejects it;
- the chief's ModelCheckpoint saves weights (``.weights.h5``): Keras 3 saves whole models only as
  ``.keras`` files, Keras 2 not at all as those.
Rank 0 writes the final weights to OUT_DIR/weights.npz; every rank prints a checksum of them.
"""
import os
import sys

import numpy as np
import tensorflow as tf

import mpidist.horovod.tensorflow.keras as hvd  # was: import horovod.tensorflow.keras as hvd
from synthetic_mnist import BATCH, KERAS_EPOCHS as EPOCHS, KERAS_STEPS as STEPS, WARMUP_EPOCHS as WARMUP
from synthetic_mnist import checksum, data, model


def main(out_dir):
    hvd.init()
    images, labels = data()
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.shard(hvd.size(), hvd.rank()).repeat().batch(BATCH)

    mnist_model = model(tf.keras)

    # Horovod: adjust learning rate based on number of workers.
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=WARMUP, verbose=1),
    ]
    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, "checkpoint-{epoch}.weights.h5"), save_weights_only=True))

    verbose = 1 if hvd.rank() == 0 else 0
    history = mnist_model.fit(dataset, steps_per_epoch=STEPS // hvd.size(), callbacks=callbacks, epochs=EPOCHS,
                              verbose=verbose)

    weights = mnist_model.get_weights()
    print(f"rank {hvd.rank()}: weights checksum {checksum(weights)}; loss {history.history['loss']}", flush=True)
    if hvd.rank() == 0:
        np.savez(os.path.join(out_dir, "weights.npz"), *weights)


if __name__ == "__main__":
    main(sys.argv[1])
