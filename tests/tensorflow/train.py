"""A TensorFlow task driven only by TF_CONFIG, as it would run in a DistTrainJob pod.

    worker (no ps in the cluster)  -> MultiWorkerMirroredStrategy, model.fit with tf-keras
    chief  (ps in the cluster)     -> ParameterServerStrategy coordinator, model.fit with tf-keras
    ps / worker (ps in the cluster)-> tf.distribute.Server(...).join(): never returns
    evaluator                      -> waits for the chief's checkpoint and evaluates it

Prints one JSON line {"task":..., "loss":..., "weights":...} and writes it to $RESULT_FILE.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3's fit fails under these strategies
import numpy as np
import tf_keras as keras

import tensorflow as tf

STEPS = 6


def data() -> tf.data.Dataset:
    rng = np.random.RandomState(0)
    x = rng.rand(256, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [3.0], [0.5]], dtype="float32")).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def model() -> keras.Model:
    m = keras.Sequential([keras.layers.Dense(1, input_shape=(4,), kernel_initializer="zeros")])
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return m


def report(task: str, loss: list, weights: list) -> None:
    line = json.dumps({"task": task, "loss": [float(v) for v in loss],
                       "weights": [np.asarray(w).tolist() for w in weights]})
    print(line, flush=True)
    with open(os.environ["RESULT_FILE"], "w") as f:
        f.write(line)


def main() -> int:
    config = json.loads(os.environ["TF_CONFIG"])
    task = f"{config['task']['type']}-{config['task']['index']}"
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    has_ps = "ps" in config["cluster"]
    checkpoint_dir = os.environ["CHECKPOINT_DIR"]

    if resolver.task_type == "evaluator":
        deadline = time.time() + 240
        while tf.train.latest_checkpoint(checkpoint_dir) is None:
            if time.time() > deadline:
                return 3
            time.sleep(0.5)
        m = model()
        tf.train.Checkpoint(model=m).restore(tf.train.latest_checkpoint(checkpoint_dir)).expect_partial()
        loss = m.evaluate(data().batch(32), verbose=0)
        report(task, [loss], m.get_weights())
        return 0

    if has_ps and resolver.task_type in ("ps", "worker"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol="grpc", start=True)
        print(f"{task}: serving", flush=True)
        server.join()  # never returns: the operator deletes these pods when the chief is done
        return 0

    if has_ps:
        strategy = tf.distribute.ParameterServerStrategy(resolver)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    with strategy.scope():
        m = model()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = data().shuffle(256, seed=1).repeat().batch(16).with_options(options)
    history = m.fit(dataset, epochs=2, steps_per_epoch=STEPS // 2, verbose=0)
    if resolver.task_type == "chief" or not has_ps:
        # Only one writer (the chief, or worker 0 without one); the rest write to a scratch dir.
        target = checkpoint_dir if resolver.task_type == "chief" or resolver.task_id == 0 else \
            os.path.join(checkpoint_dir, f"scratch-{task}")
        tf.train.Checkpoint(model=m).save(os.path.join(target, "ckpt"))
    report(task, history.history["loss"], m.get_weights())
    return 0


if __name__ == "__main__":
    sys.exit(main())
