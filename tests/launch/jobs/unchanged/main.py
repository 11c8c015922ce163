"""TensorFlow's "Multi-worker training with Keras" tutorial's main.py, written as the tutorial
writes it: it reads TF_CONFIG itself to size the global batch and builds
tf.distribute.MultiWorkerMirroredStrategy(). Not a line of mpidist in it: `mpidist run` launches it.

Usage: main.py OUT_DIR PER_WORKER_BATCH_SIZE
Besides the tutorial's training, each worker writes its final weights to
OUT_DIR/weights.<task index>.npy and one line "task <index> of <workers>: <facts>" for the test.
Seeded (keras.utils.set_random_seed) so that runs of different sizes can be compared.
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import mnist_setup

tf.keras.utils.set_random_seed(1)
out_dir, per_worker_batch_size = sys.argv[1], int(sys.argv[2])
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = mnist_setup.build_and_compile_cnn_model()

history = multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=5, verbose=0)

task = tf_config['task']['index']
weights = np.concatenate([w.ravel() for w in multi_worker_model.get_weights()])
np.save(os.path.join(out_dir, f"weights.{task}.npy"), weights)
facts = {"replicas": strategy.num_replicas_in_sync,
         "isinstance": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
         "strategy": type(strategy).__module__, "loss": history.history["loss"][-1]}
print(f"task {task} of {num_workers}: {json.dumps(facts)}", flush=True)
