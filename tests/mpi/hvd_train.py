"""One Horovod rank for the real-mpirun test: a few steps of tf.keras training on its own shard.

    hvd_train.py RESULT_DIR

Each rank starts from different initial weights (its own seed) and sees different data; the
BroadcastGlobalVariablesCallback must align the weights and the DistributedOptimizer average the
gradients, so every rank must end with the same weights. Writes RESULT_DIR/rank-<rank>.json.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

STEPS_PER_EPOCH = 8
EPOCHS = 4
BATCH = 16


def main() -> None:
    result_dir = Path(sys.argv[1])
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rank, size = hvd.rank(), hvd.size()

    tf.random.set_seed(100 + rank)  # different starting weights on every rank
    rng = np.random.default_rng(rank)  # and a different shard of data
    true_w = np.array([[2.0], [-3.0], [0.5]], dtype=np.float32)
    x = rng.normal(size=(STEPS_PER_EPOCH * BATCH, 3)).astype(np.float32)
    y = x @ true_w + 1.0

    model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(1)])
    initial = [w.tolist() for w in model.get_weights()]
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.05 * size))
    model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

    result = {
        "rank": rank,
        "size": size,
        "local_rank": hvd.local_rank(),
        "mpi_enabled": hvd.mpi_enabled(),
        "hostname": socket.gethostname(),
        "initial_weights": initial,
        "final_weights": [w.tolist() for w in model.get_weights()],
        "loss": [float(v) for v in history.history["loss"]],
        "tensorflow": tf.__version__,
    }
    (result_dir / f"rank-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
