"""ParameterServerStrategy with an evaluator: one script for every role, chosen by TF_CONFIG.

  ps, worker -> a tf.distribute.Server that serves until the operator deletes the pod
                (they never exit: the chief's exit ends the job, cleanPodPolicy removes them)
  chief      -> the coordinator: model.fit through the ps and workers, writes checkpoints
  evaluator  -> waits for the chief's checkpoint and evaluates it (it is not in TF_CONFIG's
                cluster: it serves nothing and trains nothing)

Environment: TRAIN_STEPS (default 200), CHECKPOINT_DIR (shared by chief and evaluator, default
/tmp/checkpoints), RESULT_FILE (optional, for tests).
"""

import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3's fit fails under this strategy (TF 2.21)
import numpy as np
import tensorflow as tf
import tf_keras as keras

try:  # the disttrain images' progress client: the chief reports training, the evaluator evaluation
    import disttrain_progress
except ImportError:  # run elsewhere: nothing to report to
    disttrain_progress = None


def arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.rand(1024, 8).astype("float32")
    y = (x @ rng.randn(8, 1).astype("float32") + 0.5).astype("float32")
    return x, y


def data() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(arrays())


def build_model() -> keras.Model:
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(8,), kernel_initializer="zeros")])
    # 0.1, not 0.2: asynchronous workers apply stale gradients, and at 0.2 one step of staleness can
    # make SGD diverge on this problem (a clean-clone make test saw the chief's loss end at 1.10
    # against 0.62 untrained; a simulation with a one-step-stale gradient diverges at 0.2, not at 0.1).
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def report(task: str, loss: list, model: keras.Model) -> None:
    # The untrained model predicts 0 (zero weights): its loss is the mean of y squared. Training
    # with asynchronous workers is noisy step to step; against this baseline it is unmistakable.
    untrained = float(np.mean(np.square(arrays()[1])))
    print(json.dumps({"task": task, "final_loss": float(loss[-1]), "untrained_loss": untrained}), flush=True)
    if os.environ.get("RESULT_FILE"):
        with open(os.environ["RESULT_FILE"], "w") as f:
            json.dump({"task": task, "loss": [float(v) for v in loss], "untrained_loss": untrained,
                       "weights": [w.tolist() for w in model.get_weights()]}, f)


def main() -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    checkpoints = os.environ.get("CHECKPOINT_DIR", "/tmp/checkpoints")
    task = f"{resolver.task_type}-{resolver.task_id}"

    if resolver.task_type in ("ps", "worker"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
        print(f"{task}: serving", flush=True)
        server.join()
        return

    if resolver.task_type == "evaluator":
        while tf.train.latest_checkpoint(checkpoints) is None:
            time.sleep(1)
        model = build_model()
        tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(checkpoints)).expect_partial()
        loss = model.evaluate(data().batch(64), verbose=0)
        if disttrain_progress:
            disttrain_progress.report(epoch=2, metrics={"loss": loss})
            disttrain_progress.flush()
        report(task, [loss], model)
        return

    steps = int(os.environ.get("TRAIN_STEPS", "200"))
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = build_model()
    callbacks = [disttrain_progress.keras_callback()] if disttrain_progress else []
    history = model.fit(data().shuffle(1024, seed=1).repeat().batch(32), epochs=2,
                        steps_per_epoch=max(1, steps // 2), verbose=2, callbacks=callbacks)
    tf.train.Checkpoint(model=model).save(os.path.join(checkpoints, "ckpt"))
    report(task, history.history["loss"], model)


if __name__ == "__main__":
    main()
