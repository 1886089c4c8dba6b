"""A Keras script that knows nothing of disttrain: MultiWorkerMirroredStrategy, an epoch-mode
BackupAndRestore, and a log of where each fit starts (tests/integration/test_keras_checkpoint.py).
Arguments: BACKUP_DIR; TF_CONFIG as the job gives it."""

import json
import sys
import time

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
rng = np.random.RandomState(0)
data = tf.data.Dataset.from_tensor_slices((rng.rand(640, 8).astype("float32"), rng.rand(640, 1).astype("float32")))


class Where(tf.keras.callbacks.Callback):  # type: ignore[misc]
    def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if not hasattr(self, "started"):
            self.started = True
            print(json.dumps({"event": "start", "epoch": int(self.epoch), "batch": int(batch)}), flush=True)

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        time.sleep(0.05)  # long enough to be asked mid-epoch

    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        print(json.dumps({"event": "epoch_end", "epoch": epoch}), flush=True)


model.fit(data.repeat().batch(32), epochs=30, steps_per_epoch=50, verbose=0,
          callbacks=[tf.keras.callbacks.BackupAndRestore(sys.argv[1]), Where()])
