# %% [markdown]
# # Train MNIST on two workers from Python
#
# The disttrain client, as in a notebook (each `# %%` is a cell; Jupyter, VS Code and PyCharm
# run them one by one; `python notebook.py` runs them all). It needs a cluster with the disttrain
# operator, and disttrain installed here (`pip install .` in a checkout, or its wheel: README):
# the kubeconfig's current context (or, in a pod, its ServiceAccount) says where. No checkpoint
# volume here, so a restarted job starts at epoch 0: see examples/multi-worker-mirrored/job.yaml
# for one that resumes.

# %%
import os

from disttrain.client import Client, Container, Job, Replica, RestartPolicy, RunPolicy, Spec, TensorFlow

NAME = os.environ.get("JOB_NAME", "mnist-from-python")
IMAGE = os.environ.get("IMAGE", "disttrain/tensorflow:2.21")

# %% [markdown]
# The job: typed, and checked against the CRD's schema by disttrain's tests. `to_manifest()`
# shows the YAML `kubectl apply` would take.

# %%
job = Job(NAME, Spec(
    tensorflow=TensorFlow(worker=Replica(
        replicas=2,
        restart_policy=RestartPolicy.EXIT_CODE,  # a killed worker (exit 128+) restarts the job; exit 1 fails it
        container=Container(IMAGE, command=["python", "/opt/disttrain/examples/multi-worker-mirrored/train.py"],
                            env={"TRAIN_STEPS": "200"}, cpu=2, memory="4Gi"))),
    run_policy=RunPolicy(backoff_limit=3, active_deadline_seconds=3600)))
job.to_manifest()

# %%
dt = Client()  # or Client("team-a", kubeconfig="...", context="...")
dt.submit(job)

# %% [markdown]
# Wait: the phase, ready pods and restarts, one line updated in place in a notebook, a line per
# change in a terminal.

# %%
status = dt.wait(NAME, until=["Running"], timeout=600)

# %% [markdown]
# Every worker's log, prefixed with its pod, as it comes, through restarts, until the job ends.
# (`disttrain logs NAME -f` and `kubectl disttrain logs NAME -f` print the same.)

# %%
for line in dt.logs(NAME, follow=True):
    print(line)

# %%
status = dt.wait(NAME)
print(status.line())

# %%
dt.delete(NAME, wait=True)
dt.close()
