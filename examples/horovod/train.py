"""Horovod with Keras (TF 2.15, Keras 2): each MPI rank trains on its shard, gradients are
averaged with allreduce, and rank 0's initial weights are broadcast so every rank starts equal.

Environment: TRAIN_STEPS (default 200), RESULT_FILE (optional: per rank, `{rank}` is replaced).
"""

import json
import os

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf


def main() -> None:
    hvd.init()
    rng = np.random.RandomState(hvd.rank())
    x = rng.rand(512, 8).astype("float32")
    y = (x @ np.arange(1, 9, dtype="float32").reshape(8, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(8,))])
    # Scale the learning rate by the number of ranks: the effective batch is that much larger.
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=optimizer, loss="mse")
    steps = int(os.environ.get("TRAIN_STEPS", "200"))
    history = model.fit(data, steps_per_epoch=max(1, steps // 2), epochs=2,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
                        verbose=2 if hvd.rank() == 0 else 0)
    result = {"rank": hvd.rank(), "size": hvd.size(), "loss": history.history["loss"],
              "weights": [w.tolist() for w in model.get_weights()]}
    print(json.dumps({"rank": hvd.rank(), "final_loss": result["loss"][-1]}), flush=True)
    if os.environ.get("RESULT_FILE"):
        with open(os.environ["RESULT_FILE"].replace("{rank}", str(hvd.rank())), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
