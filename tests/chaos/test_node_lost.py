"""A node lost under running jobs (issue 12, item 3): deleted, or gone silent (NotReady).

Deleted, its pods go with it (the pod garbage collector's orphan sweep, then the fake node's
delete). Silent (KWOK no longer heartbeats it), the node lifecycle controller marks it
unreachable after its grace period and taints it NoExecute; the taint eviction controller evicts
the pods once their toleration runs out (the test's pods tolerate 5 s, where the API server's
default is 300 s, so that the rest of the suite's pods are never evicted by a slow heartbeat).
The fake node's stand-in for a kubelet (hack/podreaper.py) confirms the evicted pods gone, as a
kubelet does once it is back: on a real cluster a pod of a partitioned node stays Terminating until
then, and the operator waits for it rather than run two pods of one name. Either way each job that
had a pod there handles it as its policy says: restarted on the nodes left (a retryable loss), or
failed with a message naming the pod and what ended it (restartPolicy Never). Never a job left
Running with pods that no longer exist; jobs with no pod there are not disturbed."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from chaos_support import mpi_small, tf_small
from kubernetes import client
from scripts import story

from manifests import job, replica
from support import Cluster, OperatorProcess, wait_for


def running_pods(cluster: Cluster, ns: str, count: int) -> list[Any]:
    def check() -> list[Any] | None:
        pods = [p for p in cluster.pods(ns) if p.metadata.deletion_timestamp is None]
        return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None
    return wait_for(check, 60, f"{count} running pods")


# How each loss reads in a failed job's message (the pod's DisruptionTarget condition).
LOSSES = {"deleted": "node no longer exists", "silent": "deleting due to NoExecute taint"}
# The pods' own tolerations of an unreachable or not-ready node (the default is 300 s).
SHORT_TOLERATIONS = [{"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
                      "tolerationSeconds": 5} for taint in ("unreachable", "not-ready")]


def tolerating(manifest: dict[str, Any]) -> dict[str, Any]:
    for framework in ("tensorflow", "mpi"):
        for replica_spec in (manifest["spec"].get(framework) or {}).values():
            if isinstance(replica_spec, dict) and "template" in replica_spec:
                replica_spec["template"]["spec"]["tolerations"] = SHORT_TOLERATIONS
    return manifest


def where_things_stand(cluster: Cluster, ns: str, node: str, jobs: dict[str, Any]) -> str:
    """The node's conditions and taints, each job's status and each pod's: what a timeout leaves."""
    try:
        found = cluster.core.read_node(node)
        lines = [f"node {node}: " + ", ".join(f"{c.type}={c.status}" for c in found.status.conditions or [])
                 + "; taints " + ", ".join(f"{t.key}:{t.effect}" for t in found.spec.taints or [])]
    except client.ApiException as err:
        lines = [f"node {node}: {err.status}"]
    for name in jobs:
        status = cluster.job_status(ns, name)
        lines.append(f"{name}: {status.get('phase')} {status.get('reason')} restarts={status.get('restarts')} "
                     f"{status.get('message')}")
    for pod in cluster.pods(ns):
        lines.append(f"  {pod.metadata.name} on {pod.spec.node_name}: {pod.status.phase}"
                     f"{' deleting' if pod.metadata.deletion_timestamp else ''}")
    return "\n".join(lines)


def node_ready(cluster: Cluster, name: str) -> bool:
    node = cluster.core.read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


@pytest.mark.chaos_full
@pytest.mark.parametrize("loss", list(LOSSES))
def test_a_node_lost_under_running_jobs(cluster: Cluster, operator: OperatorProcess, namespace: str,
                                        loss: str) -> None:
    ns = namespace
    jobs = {f"tf-{i}": tf_small(f"tf-{i}", workers=3) for i in range(4)}
    jobs |= {f"mpi-{i}": mpi_small(f"mpi-{i}", workers=2) for i in range(2)}
    jobs |= {f"never-{i}": job(f"never-{i}", {"tensorflow": {"worker": replica(3, "Never", cpu="100m")}})
             for i in range(2)}
    for manifest in jobs.values():
        cluster.apply(tolerating(manifest), ns)
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
    index = int(node.rsplit("-", 1)[1])
    if loss == "deleted":
        cluster.core.delete_node(node)
    else:
        cluster.local.silence_node(index)
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
        # Silent: about 50 s until the node is marked unreachable, 5 s of toleration, then the restarts.
        try:
            statuses = wait_for(settled, 240, f"the jobs with pods on {node} recovered or failed", interval=1)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{where_things_stand(cluster, ns, node, jobs)}") from None
    finally:
        if loss == "deleted":
            cluster.local.create_node(index)
        else:
            cluster.local.silence_node(index, silent=False)
            wait_for(lambda: node_ready(cluster, node), 120, f"{node} Ready again")
    took = time.monotonic() - started
    print(f"\nnode {node} {loss} with pods of {sorted(on_node)} (to fail: {sorted(fails)}): handled in {took:.0f}s; "
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
                    and LOSSES[loss] in message):
                wrong[name] = status
        elif status.get("restarts") != 1:
            wrong[name] = status
    assert not wrong, f"{wrong}\n" + "\n".join(story(cluster, ns, n) for n in wrong)
