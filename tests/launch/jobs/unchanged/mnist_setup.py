"""TensorFlow's "Multi-worker training with Keras" tutorial's mnist_setup.py, as its readers copy it,
with a small synthetic data set instead of MNIST (no download here). Untouched by mpidist."""
import numpy as np
import tensorflow as tf


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 255, (480, 12, 12)).astype(np.uint8)
    y_train = rng.integers(0, 10, 480).astype(np.int64)
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(480).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(12, 12)),
        tf.keras.layers.Reshape(target_shape=(12, 12, 1)),
        tf.keras.layers.Conv2D(4, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
        metrics=['accuracy'])
    return model
