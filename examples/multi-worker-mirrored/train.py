"""MultiWorkerMirroredStrategy: every worker holds the whole model; gradients are all-reduced.

Runs as-is in a DistTrainJob pod: TensorFlow reads the cluster and this task's place in it from
TF_CONFIG, which the operator injects. Synthetic data, no download. Worker 0 is the chief here
(no chief replica): it alone writes the checkpoint.

Environment: TRAIN_STEPS (default 200), CHECKPOINT_DIR (default /tmp/checkpoints),
RESULT_FILE (optional: the final loss and weights as JSON, for tests).
"""

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3's fit fails under this strategy (TF 2.21)
import numpy as np
import tensorflow as tf
import tf_keras as keras


def dataset() -> tf.data.Dataset:
    rng = np.random.RandomState(0)
    x = rng.rand(1024, 8).astype("float32")
    y = (x @ rng.randn(8, 1).astype("float32") + 0.5).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=1).repeat().batch(32).with_options(options)


def main() -> None:
    steps = int(os.environ.get("TRAIN_STEPS", "200"))
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(8,),
                                                     kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
                                  keras.layers.Dense(1, kernel_initializer="zeros")])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(dataset(), epochs=2, steps_per_epoch=max(1, steps // 2), verbose=2)

    resolver = strategy.cluster_resolver
    is_chief = resolver.task_type in (None, "chief") or (resolver.task_type == "worker" and resolver.task_id == 0)
    checkpoints = os.environ.get("CHECKPOINT_DIR", "/tmp/checkpoints")
    # Every worker must take part in saving (it is a collective); only the chief keeps its copy.
    target = checkpoints if is_chief else os.path.join(checkpoints, f"tmp-worker-{resolver.task_id}")
    tf.train.Checkpoint(model=model).save(os.path.join(target, "ckpt"))
    result = {"task": f"{resolver.task_type}-{resolver.task_id}", "loss": history.history["loss"],
              "weights": [w.tolist() for w in model.get_weights()]}
    print(json.dumps({"task": result["task"], "final_loss": result["loss"][-1]}))
    if os.environ.get("RESULT_FILE"):
        with open(os.environ["RESULT_FILE"], "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
