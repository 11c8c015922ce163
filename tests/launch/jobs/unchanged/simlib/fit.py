"""Least-squares fit of y = X w by gradient descent in a v1 graph (see the package docstring)."""
import os

import numpy as np
import tensorflow as tf

if any(name in os.environ for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
    import horovod.tensorflow as hvd
    hvd.init()
else:
    hvd = None


def size():
    return hvd.size() if hvd is not None else 1


def rank():
    return hvd.rank() if hvd is not None else 0


def fit(x, y, steps, learning_rate, initial):
    """Each rank fits its block of the rows; the gradients are averaged over the ranks."""
    x_local, y_local = np.array_split(x, size())[rank()], np.array_split(y, size())[rank()]
    graph = tf.Graph()
    with graph.as_default():
        features = tf.compat.v1.placeholder(tf.float32, [None, x.shape[1]])
        targets = tf.compat.v1.placeholder(tf.float32, [None])
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(initial, tf.float32))
        loss = tf.reduce_mean(tf.square(tf.linalg.matvec(features, w) - targets))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
        if hvd is not None:
            optimizer = hvd.DistributedOptimizer(optimizer)
        train_op = optimizer.minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
        broadcast = hvd.broadcast_global_variables(0) if hvd is not None else None
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            if broadcast is not None:
                session.run(broadcast)
            feed = {features: x_local, targets: y_local}
            for _ in range(steps):
                session.run(train_op, feed)
            return session.run(w)
