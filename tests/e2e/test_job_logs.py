"""`disttrain logs -f` on the real node, where pods have real logs: two workers' lines interleaved
with their prefixes, a container the kubelet restarts followed into its second life, and the
command ending by itself when the job succeeds. Skipped without a real node."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from e2e_support import pinned_namespace
from manifests import TF_IMAGE
from support import Cluster, OperatorProcess, wait_for

pytestmark = pytest.mark.e2e

# Worker 1 dies once (exit 1; restartPolicy OnFailure: the kubelet starts it again in the same pod,
# its emptyDir kept), then lives on until the job ends; worker 0 counts to 5 and succeeds.
SCRIPT = """
import os, sys, time
index, marker = os.environ["DISTTRAIN_REPLICA_INDEX"], "/scratch/first-life-over"
if index == "1" and not os.path.exists(marker):
    open(marker, "w").close()
    print("worker 1 first life", flush=True)
    sys.exit(1)
for step in range(5 if index == "0" else 10**6):
    print(f"worker {index} step {step}", flush=True)
    time.sleep(2 if index == "0" else 1)
"""


@pytest.fixture
def node_namespace(cluster: Cluster) -> Iterator[str]:
    import realnode

    if not cluster.core.list_node(label_selector=f"{realnode.NODE_KEY}=true").items:
        pytest.skip("no real node in this cluster (DISTTRAIN_REAL_NODE=1, make node images)")
    name = pinned_namespace(cluster, f"logs-{uuid.uuid4().hex[:6]}")
    yield name
    cluster.core.delete_namespace(name)


def test_logs_follow_a_whole_job_on_the_real_node(cluster: Cluster, operator: OperatorProcess,
                                                  node_namespace: str) -> None:
    from disttrain.client import Job, Replica, RestartPolicy, Spec, TensorFlow

    template = {"spec": {"containers": [{"name": "tf", "image": TF_IMAGE,
                                         "command": ["python", "-c", SCRIPT],
                                         "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
                         "volumes": [{"name": "scratch", "emptyDir": {}}]}}
    job = Job("talk", Spec(tensorflow=TensorFlow(worker=Replica(replicas=2, restart_policy=RestartPolicy.ON_FAILURE,
                                                                template=template))))
    cluster.apply(job.to_manifest(node_namespace))
    wait_for(lambda: cluster.job_status(node_namespace, "talk"), 60, "the job's status")
    follow = subprocess.Popen([sys.executable, "-m", "disttrain", "logs", "talk", "-n", node_namespace, "-f"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env())
    try:
        out, err = follow.communicate(timeout=300)  # the job ends: so does the command
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    assert cluster.job_status(node_namespace, "talk")["phase"] == "Succeeded"
    lines = out.splitlines()
    sys.stderr.write("\n".join(lines[:40]) + "\n")  # an excerpt, for pytest -s
    assert [line for line in lines if line.startswith("[worker-0]")] == [f"[worker-0] worker 0 step {i}"
                                                                        for i in range(5)]
    worker1 = [line for line in lines if line.startswith("[worker-1]")]
    assert "[worker-1] worker 1 step 0" in worker1 and any("--- restarted" in line for line in worker1), worker1
    # Interleaved as they came, not one pod after the other.
    first_w1 = lines.index("[worker-1] worker 1 step 0")
    assert lines.index("[worker-0] worker 0 step 4") > first_w1, lines
