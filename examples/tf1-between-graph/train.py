"""TF1-style between-graph replication: ps hold the variables, each worker builds its own graph
and trains asynchronously, worker 0 is the chief (initialises, checkpoints). All from TF_CONFIG.

The ps never exit (server.join()); the job ends when worker 0 succeeds (successPolicy
ChiefOrWorker0) and the operator deletes the ps and the remaining workers.

Environment: TRAIN_STEPS (default 500), CHECKPOINT_DIR (default /tmp/checkpoints), RESULT_FILE (optional).
"""

import json
import os

import numpy as np
import tensorflow as tf

try:  # the disttrain images' progress client: worker 0 (the chief) reports the global step and loss
    import disttrain_progress
except ImportError:  # run elsewhere: nothing to report to
    disttrain_progress = None

v1 = tf.compat.v1


def main() -> None:
    v1.disable_eager_execution()
    config = json.loads(os.environ["TF_CONFIG"])
    task_type, task_index = config["task"]["type"], config["task"]["index"]
    cluster = tf.train.ClusterSpec(config["cluster"])
    # Each worker talks to the ps and itself only: without the filter a worker's session waits
    # for every other worker, and hangs once worker 0 has finished and left.
    session_config = v1.ConfigProto(device_filters=["/job:ps", f"/job:{task_type}/task:{task_index}"])
    server = v1.train.Server(cluster, job_name=task_type, task_index=task_index, config=session_config)
    if task_type == "ps":
        server.join()
        return

    steps = int(os.environ.get("TRAIN_STEPS", "500"))
    rng = np.random.RandomState(task_index)
    true_w = np.array([[2.0], [-1.0], [0.5]], dtype="float32")
    with v1.device(v1.train.replica_device_setter(worker_device=f"/job:worker/task:{task_index}", cluster=cluster)):
        x = v1.placeholder(tf.float32, [None, 3])
        y = v1.placeholder(tf.float32, [None, 1])
        w = v1.get_variable("w", [3, 1], initializer=v1.zeros_initializer())
        loss = v1.reduce_mean(tf.square(tf.matmul(x, w) - y))
        global_step = v1.train.get_or_create_global_step()
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)

    hooks = [v1.train.StopAtStepHook(last_step=steps)]
    checkpoint_dir = os.environ.get("CHECKPOINT_DIR", "/tmp/checkpoints") if task_index == 0 else None
    losses = []
    with v1.train.MonitoredTrainingSession(master=server.target, is_chief=task_index == 0, hooks=hooks,
                                           checkpoint_dir=checkpoint_dir, config=session_config) as session:
        while not session.should_stop():
            batch = rng.rand(32, 3).astype("float32")
            _, value, step = session.run([train_op, loss, global_step], feed_dict={x: batch, y: batch @ true_w})
            losses.append(float(value))
            if disttrain_progress:  # only the chief's pod reports; the call only hands the latest over
                disttrain_progress.report(step=min(int(step), steps), total_steps=steps, metrics={"loss": value})
    if disttrain_progress:
        disttrain_progress.flush()
    print(json.dumps({"task": f"{task_type}-{task_index}", "first_loss": losses[0] if losses else None,
                      "final_loss": losses[-1] if losses else None}), flush=True)
    if os.environ.get("RESULT_FILE"):
        with open(os.environ["RESULT_FILE"], "w") as f:
            json.dump({"task": f"{task_type}-{task_index}", "loss": losses}, f)


if __name__ == "__main__":
    main()
