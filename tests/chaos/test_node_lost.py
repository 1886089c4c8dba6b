"""A node deleted under running jobs (issue 12, item 3).

Its pods go with it (the pod garbage collector's orphan sweep, then the fake node's delete), and
each job that had a pod there handles it as its policy says: restarted on the nodes left (a
retryable loss), or failed with a message naming the pod (restartPolicy Never). Never a job left
Running with pods that no longer exist; jobs with no pod there are not disturbed."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from chaos_support import mpi_small, tf_small
from scripts import story

from manifests import job, replica
from support import Cluster, OperatorProcess, wait_for


def running_pods(cluster: Cluster, ns: str, count: int) -> list[Any]:
    def check() -> list[Any] | None:
        pods = [p for p in cluster.pods(ns) if p.metadata.deletion_timestamp is None]
        return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None
    return wait_for(check, 60, f"{count} running pods")


@pytest.mark.chaos_full
def test_a_node_deleted_under_running_jobs(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    ns = namespace
    jobs = {f"tf-{i}": tf_small(f"tf-{i}", workers=3) for i in range(4)}
    jobs |= {f"mpi-{i}": mpi_small(f"mpi-{i}", workers=2) for i in range(2)}
    jobs |= {f"never-{i}": job(f"never-{i}", {"tensorflow": {"worker": replica(3, "Never", cpu="100m")}})
             for i in range(2)}
    for manifest in jobs.values():
        cluster.apply(manifest, ns)
    pods = running_pods(cluster, ns, 4 * 3 + 2 * 3 + 2 * 3)
    for name in jobs:
        cluster.wait_phase(ns, name, "Running")
    # The node with most of the jobs' pods: the loss that hurts most.
    node = Counter(p.spec.node_name for p in pods).most_common(1)[0][0]
    on_node = {p.metadata.labels["disttrain.dev/job-name"] for p in pods if p.spec.node_name == node}
    # restartPolicy Never (every never-* pod, and the MPI launchers): the job fails instead.
    fails = {p.metadata.labels["disttrain.dev/job-name"] for p in pods if p.spec.node_name == node
             and (p.metadata.name.startswith("never-") or p.metadata.name.endswith("-launcher"))}
    before = {p.metadata.uid for p in pods}
    started = time.monotonic()
    cluster.core.delete_node(node)
    try:
        def settled() -> dict[str, dict[str, Any]] | None:
            statuses = {name: cluster.job_status(ns, name) for name in jobs}
            live = [p for p in cluster.pods(ns) if p.metadata.deletion_timestamp is None]
            if any(p.spec.node_name == node for p in live):
                return None  # not noticed yet
            for name, status in statuses.items():
                if name not in on_node:
                    continue
                if name in fails:
                    if status.get("phase") != "Failed":
                        return None
                    continue
                mine = [p for p in live if p.metadata.labels["disttrain.dev/job-name"] == name]
                if (status.get("phase") != "Running" or len(mine) != 3
                        or any(p.metadata.uid in before for p in mine)
                        or not all(p.status.phase == "Running" for p in mine)):
                    return None
            return statuses
        statuses = wait_for(settled, 180, f"the jobs with pods on {node} recovered or failed", interval=1)
    finally:
        index = int(node.rsplit("-", 1)[1])
        cluster.local.create_node(index)
    took = time.monotonic() - started
    print(f"\nnode {node} deleted with pods of {sorted(on_node)} (to fail: {sorted(fails)}): handled in {took:.0f}s; "
          + "; ".join(f"{n}: {s.get('phase')} {s.get('reason')} {s.get('message')}" for n, s in statuses.items()
                      if n in on_node))
    wrong = {}
    for name, status in statuses.items():
        if name not in on_node:
            if (status.get("phase"), status.get("restarts")) != ("Running", 0):
                wrong[name] = status
        elif name in fails:
            message = status.get("message", "")
            if not (status.get("reason") == "ReplicaFailed" and f"pod {name}-" in message
                    and "node no longer exists" in message):
                wrong[name] = status
        elif status.get("restarts") != 1:
            wrong[name] = status
    assert not wrong, f"{wrong}\n" + "\n".join(story(cluster, ns, n) for n in wrong)
