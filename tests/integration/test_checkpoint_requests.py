"""A checkpoint before a stop the operator chooses (issue 33) on the real plane: the session's
operator serves its progress endpoint, so a suspended job's running pods are annotated with a
checkpoint request and kept until worker 0 confirms it (a report made as the pod would make it:
tests/progress_support.py) or the grace passes. The kubelet writing the request into the pods'
file, and the examples honouring it: tests/e2e."""

from __future__ import annotations

import time
from pathlib import Path

import disttrain_progress
from manifests import mwms_job
from progress_support import progress_volume
from support import Cluster, OperatorProcess, wait_for, wait_pods_running

REQUEST = "disttrain.dev/checkpoint-request"


def suspend(cluster: Cluster, ns: str) -> None:
    cluster.kubectl("patch", "dtj", "ckpt", "-n", ns, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')


def requested(cluster: Cluster, ns: str, pods: list[str]) -> str:
    """The request once every pod carries it (the one status.checkpoint names)."""
    def annotated() -> str | None:
        status = cluster.job_status(ns, "ckpt").get("checkpoint") or {}
        found = {(cluster.core.read_namespaced_pod(p, ns).metadata.annotations or {}).get(REQUEST) for p in pods}
        return status.get("request") if found == {status.get("request")} and status else None
    return wait_for(annotated, 30, "the request on every running pod")


def test_a_suspend_waits_for_the_confirmed_checkpoint(cluster: Cluster, operator: OperatorProcess, namespace: str,
                                                      tmp_path: Path) -> None:
    cluster.apply(mwms_job("ckpt", workers=2, checkpointGraceSeconds=120), namespace)
    pods = [p.metadata.name for p in wait_pods_running(cluster, namespace, "ckpt", 2)]
    volume = progress_volume(cluster, namespace, "ckpt-worker-0", tmp_path)
    suspend(cluster, namespace)
    request = requested(cluster, namespace, pods)
    time.sleep(2)
    assert len(wait_pods_running(cluster, namespace, "ckpt", 2)) == 2, "held while the training saves"
    reporter = disttrain_progress.Reporter(str(volume), min_interval=0.1)
    reporter.report(epoch=1, step=300)
    assert reporter.confirm(request, step=300, path="/checkpoints/ckpt-300") and reporter.refused == 0
    status = wait_for(lambda: (s := cluster.job_status(namespace, "ckpt")).get("phase") == "Suspended" and s, 20,
                      "suspended once confirmed")
    assert status["lastCheckpoint"]["request"] == request and status["lastCheckpoint"]["step"] == 300
    assert "checkpoint" not in status
    cluster.wait_event(namespace, "ckpt", lambda e: e.reason == "Checkpointed" and "step 300" in e.message,
                       "the Checkpointed event")
    wait_for(lambda: not [p for p in cluster.pods(namespace, "disttrain.dev/job-name=ckpt")
                          if not p.metadata.deletion_timestamp], 30, "the pods deleted")
    # Its 2 GPUs' seconds (status.usage): the hold for the checkpoint (at least the 2 s above) is
    # `checkpoint`; the pods' going is counted once they are gone (within 5 s), as `other`.
    time.sleep(6)
    usage = cluster.job_status(namespace, "ckpt")["usage"]
    print(f"\nusage: {usage}")
    assert usage["state"] == "other" and usage["seconds"]["checkpoint"] >= 2 * 2, usage
    assert abs(sum(usage["seconds"].values()) - usage["allocatedSeconds"]) < 0.5, usage


def test_a_checkpoint_never_confirmed_stops_the_job_at_the_grace(cluster: Cluster, operator: OperatorProcess,
                                                                 namespace: str) -> None:
    cluster.apply(mwms_job("ckpt", workers=2, checkpointGraceSeconds=4), namespace)
    pods = [p.metadata.name for p in wait_pods_running(cluster, namespace, "ckpt", 2)]
    suspend(cluster, namespace)
    requested(cluster, namespace, pods)
    asked = time.monotonic()
    wait_for(lambda: cluster.job_status(namespace, "ckpt").get("phase") == "Suspended", 20, "suspended at the grace")
    assert time.monotonic() - asked >= 2, "not before the grace"
    event = cluster.wait_event(namespace, "ckpt", lambda e: e.reason == "CheckpointTimedOut", "the Warning")
    assert event.type == "Warning" and "within 4s" in event.message
