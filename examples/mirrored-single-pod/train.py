"""MirroredStrategy on one pod with several GPUs: no TF_CONFIG cluster needed (one worker).

A DistTrainJob with one worker still gives the pod a stable name, restart policy, deadlines and
status. The GPUs are the pod's `nvidia.com/gpu` limit; TensorFlow sees them all.
Environment: TRAIN_STEPS (default 300).
"""

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np
import tensorflow as tf
import tf_keras as keras


def main() -> None:
    strategy = tf.distribute.MirroredStrategy()
    print(f"replicas in sync: {strategy.num_replicas_in_sync}", flush=True)
    rng = np.random.RandomState(0)
    x = rng.rand(4096, 32).astype("float32")
    y = (x.sum(axis=1) > 16).astype("int32")
    batch = 64 * strategy.num_replicas_in_sync
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=1).repeat().batch(batch)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                                  keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    steps = int(os.environ.get("TRAIN_STEPS", "300"))
    history = model.fit(data, epochs=3, steps_per_epoch=max(1, steps // 3), verbose=2)
    print(json.dumps({"final_accuracy": history.history["accuracy"][-1]}))


if __name__ == "__main__":
    main()
