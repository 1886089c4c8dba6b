"""Horovod with Keras (TF 2.15, Keras 2): each MPI rank trains on its shard, gradients are
averaged with allreduce, and rank 0's weights are broadcast so every rank starts equal.

A lost worker costs at most one epoch: rank 0 saves the model, optimizer and epoch at every
epoch's end under CHECKPOINT_DIR (a volume the worker pods share), and when the operator restarts
the job, rank 0 restores the latest checkpoint and every rank resumes at the next epoch. Rank 0
prints one JSON line per event: {"event": "start", "epoch": 3, "resumed": true}.

The ranks run on the worker pods, started over SSH by mpirun: they see only the environment
mpirun exports (-x), not the worker containers' own.

The same seed gives the same run, whichever way the ranks were started (mpirun over SSH, or
spec.mpi.bootstrap Gloo): rank 0's initial weights are everyone's, and each rank's data is its own.

Where the pod's DRA claims handed its container devices, each rank takes one by its local rank and
says which: {"event": "device", "rank": 1, "local_rank": 1, "device": "gpu-7", "claim": "<claim uid>"}
(dra-example-driver names them GPU_DEVICE_<n> in the environment; examples/horovod-dra). With the
Gloo bootstrap only: ranks mpirun starts over SSH see none of the container's environment.

Environment: TRAIN_STEPS (default 200, over all epochs), EPOCHS (default 4), CHECKPOINT_DIR
(default /tmp/checkpoints), SEED (default 42), RESULT_FILE (optional: per rank, `{rank}` is replaced).
"""

import hashlib
import json
import os
import re
import sys
import time

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

try:  # the disttrain images' progress client: rank 0 reports epochs, steps and loss to the operator
    import disttrain_progress
except ImportError:  # run elsewhere: nothing to report to
    disttrain_progress = None


def say(**event: object) -> None:
    # One write per line: under PYTHONUNBUFFERED (the images') print writes the text and its newline
    # apart, and mpirun, forwarding every rank's output to one stream, put another rank's line between
    # them (`{...epoch 3...}{"event": "done", "rank": 1...}`, seen in a fresh `make test`).
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class Checkpoints(tf.keras.callbacks.Callback):
    """Rank 0 saves at each epoch's end (the other ranks hold the same weights)."""

    def __init__(self, manager: tf.train.CheckpointManager, epoch: tf.Variable) -> None:
        super().__init__()
        self.manager, self.epoch = manager, epoch
        self.stepped = False

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if hvd.rank() == 0 and not self.stepped:  # when training started, for apply-to-first-step timings
            self.stepped = True
            say(event="first_step", epoch=int(self.epoch.numpy()), batch=batch, time=time.time())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if hvd.rank() == 0:
            self.epoch.assign(epoch + 1)
            self.manager.save()
            say(event="epoch_end", epoch=epoch, loss=float((logs or {}).get("loss", 0.0)))


def claimed_device(local_rank: int) -> dict[str, str] | None:
    """The device this rank takes of those the pod's DRA claims put in its container's environment
    (by the driver's CDI spec): dra-example-driver sets GPU_DEVICE_<n>=gpu-<n> and
    GPU_DEVICE_<n>_RESOURCE_CLAIM=<claim uid> per device. None without claimed devices."""
    names = sorted((k for k in os.environ if re.fullmatch(r"GPU_DEVICE_\d+", k)), key=lambda k: int(k[11:]))
    if local_rank >= len(names):
        return None
    return {"device": os.environ[names[local_rank]], "claim": os.environ.get(f"{names[local_rank]}_RESOURCE_CLAIM", "")}


def main() -> None:
    hvd.init()
    device = claimed_device(hvd.local_rank())
    if device:
        say(event="device", rank=hvd.rank(), local_rank=hvd.local_rank(), **device)
    tf.keras.utils.set_random_seed(int(os.environ.get("SEED", "42")))
    rng = np.random.RandomState(hvd.rank())
    x = rng.rand(512, 8).astype("float32")
    y = (x @ np.arange(1, 9, dtype="float32").reshape(8, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(8,))])
    # Scale the learning rate by the number of ranks: the effective batch is that much larger.
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=optimizer, loss="mse")

    epoch = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, epoch=epoch),
                                         os.environ.get("CHECKPOINT_DIR", "/tmp/checkpoints"), max_to_keep=2)
    if hvd.rank() == 0 and manager.latest_checkpoint:
        manager.checkpoint.restore(manager.latest_checkpoint)
    start = hvd_tf.broadcast_object(int(epoch.numpy()), root_rank=0)
    if hvd.rank() == 0:
        say(event="start", epoch=start, resumed=start > 0)

    epochs = int(os.environ.get("EPOCHS", "4"))
    steps = max(1, int(os.environ.get("TRAIN_STEPS", "200")) // epochs)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), Checkpoints(manager, epoch)]
    if disttrain_progress:  # rank 0 only: the others' reporter is silent
        callbacks.append(disttrain_progress.keras_callback(disttrain_progress.for_rank(hvd.rank())))
    history = model.fit(data, steps_per_epoch=steps, initial_epoch=start, epochs=epochs, verbose=0,
                        callbacks=callbacks)
    weights = [w.tolist() for w in model.get_weights()]
    say(event="done", rank=hvd.rank(), size=hvd.size(), final_loss=history.history["loss"][-1],
        weights_sha256=hashlib.sha256(json.dumps(weights).encode()).hexdigest())
    if os.environ.get("RESULT_FILE"):
        with open(os.environ["RESULT_FILE"].replace("{rank}", str(hvd.rank())), "w") as f:
            json.dump({"rank": hvd.rank(), "size": hvd.size(), "loss": history.history["loss"], "weights": weights}, f)


if __name__ == "__main__":
    main()
