"""MultiWorkerMirroredStrategy: every worker holds the whole model; gradients are all-reduced.

Runs as-is in a DistTrainJob pod: TensorFlow reads the cluster and this task's place in it from
TF_CONFIG, which the operator injects. Synthetic data, no download. Worker 0 is the chief here
(no chief replica): it alone keeps the final checkpoint.

A lost worker costs at most one epoch: Keras BackupAndRestore saves the training state at every
epoch's end under CHECKPOINT_DIR/backup, a volume all workers share, and when the operator
restarts the job (exit 128+, restartScope Job) training resumes at the epoch after the last one
saved, not at epoch 0. A stop costs a few steps: before a suspend, a Kueue preemption or the
restart after a drained pod, and on SIGTERM, the images' Keras hook saves this same
BackupAndRestore mid-epoch and the training resumes at that step (docs/api.md, "A checkpoint
before a stop"). Each worker prints one JSON line per event, so the logs say where it started:
{"event": "start", "epoch": 3, "resumed": true}, {"event": "first_batch", "epoch": 3, "batch": 40}.

Environment: TRAIN_STEPS (default 200, over all epochs), EPOCHS (default 4), CHECKPOINT_DIR
(default /tmp/checkpoints), RESULT_FILE (optional: the final loss and weights as JSON, for tests),
LOG_EVERY_STEPS (optional: a {"event": "step"} line every that many steps, for benchmarks).
"""

import hashlib
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3's fit fails under this strategy (TF 2.21)
import numpy as np
import tensorflow as tf
import tf_keras as keras

try:  # the disttrain images' progress client: worker 0 reports epochs, steps and loss to the operator
    import disttrain_progress
except ImportError:  # run elsewhere: nothing to report to
    disttrain_progress = None


def dataset() -> tf.data.Dataset:
    rng = np.random.RandomState(0)
    x = rng.rand(1024, 8).astype("float32")
    y = (x @ rng.randn(8, 1).astype("float32") + 0.5).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=1).repeat().batch(32).with_options(options)


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


class Progress(keras.callbacks.Callback):
    """One line where training starts (resumed or not) and one per finished epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.started = False
        self.every = int(os.environ.get("LOG_EVERY_STEPS", "0"))

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch
        if not self.started:
            self.started = True
            say(event="start", epoch=epoch, resumed=epoch > 0)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if not getattr(self, "first_batch", False):  # a fit resumed mid-epoch starts past batch 0
            self.first_batch = True
            say(event="first_batch", epoch=self.epoch, batch=int(batch))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        step = self.epoch * int(self.params.get("steps") or 0) + batch + 1
        if self.every and step % self.every == 0:
            say(event="step", step=step)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        say(event="epoch_end", epoch=epoch, loss=float((logs or {}).get("loss", 0.0)))


def main() -> None:
    epochs = int(os.environ.get("EPOCHS", "4"))
    steps = max(1, int(os.environ.get("TRAIN_STEPS", "200")) // epochs)
    checkpoints = os.environ.get("CHECKPOINT_DIR", "/tmp/checkpoints")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(8,),
                                                     kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
                                  keras.layers.Dense(1, kernel_initializer="zeros")])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    backup = keras.callbacks.BackupAndRestore(backup_dir=os.path.join(checkpoints, "backup"))
    callbacks = [backup, Progress()] + ([disttrain_progress.keras_callback()] if disttrain_progress else [])
    history = model.fit(dataset(), epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)

    resolver = strategy.cluster_resolver
    is_chief = resolver.task_type in (None, "chief") or (resolver.task_type == "worker" and resolver.task_id == 0)
    # Every worker must take part in saving (it is a collective); only the chief keeps its copy.
    target = checkpoints if is_chief else os.path.join(checkpoints, f"tmp-worker-{resolver.task_id}")
    tf.train.Checkpoint(model=model).save(os.path.join(target, "ckpt"))
    weights = [w.tolist() for w in model.get_weights()]
    task = f"{resolver.task_type}-{resolver.task_id}"
    say(event="done", task=task, final_loss=history.history["loss"][-1],
        weights_sha256=hashlib.sha256(json.dumps(weights).encode()).hexdigest())
    if os.environ.get("RESULT_FILE"):
        with open(os.environ["RESULT_FILE"], "w") as f:
            json.dump({"task": task, "loss": history.history["loss"], "weights": weights}, f)


if __name__ == "__main__":
    main()
