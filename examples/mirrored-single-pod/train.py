"""MirroredStrategy on one pod with several GPUs: no TF_CONFIG cluster needed (one worker).

A DistTrainJob with one worker still gives the pod a stable name, restart policy, deadlines and
status. The GPUs are the pod's `nvidia.com/gpu` limit; TensorFlow sees them all.

With no GPU (a CPU image, a laptop, the end-to-end tests) the CPU is split into CPU_REPLICAS
logical devices and the strategy mirrors the model across those instead: the same code path
(one replica per device, gradients all-reduced in sync every step), only slower.
Environment: TRAIN_STEPS (default 300), CPU_REPLICAS (default 4).
"""

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np
import tensorflow as tf
import tf_keras as keras


def strategy_devices() -> list[str] | None:
    """None (every GPU, MirroredStrategy's default) when there are GPUs; else CPU_REPLICAS
    logical CPUs, made before TensorFlow initialises its devices (it refuses afterwards)."""
    if tf.config.list_physical_devices("GPU"):
        return None
    replicas = int(os.environ.get("CPU_REPLICAS", "4"))
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def main() -> None:
    devices = strategy_devices()
    strategy = tf.distribute.MirroredStrategy(devices=devices)
    print(json.dumps({"event": "strategy", "replicas_in_sync": strategy.num_replicas_in_sync,
                      "devices": list(strategy.extended.worker_devices)}), flush=True)
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
    # One variable, one value: each replica's copy of the weights after the last all-reduce.
    copies = [v.numpy().tobytes() for v in strategy.experimental_local_results(model.trainable_variables[0])]
    print(json.dumps({"event": "done", "replicas_in_sync": strategy.num_replicas_in_sync,
                      "losses": history.history["loss"], "final_accuracy": history.history["accuracy"][-1],
                      "replica_weights_identical": len(set(copies)) == 1, "replica_copies": len(copies)}),
          flush=True)


if __name__ == "__main__":
    main()
