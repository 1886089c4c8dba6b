"""A checkpoint before a stop the operator chooses (issue 33), on the real node: the
multi-worker-mirrored example, its script unchanged but for a log line, suspended mid-epoch. The
operator annotates its pods, the kubelet writes the request into their files, the images' Keras
hook saves through the script's BackupAndRestore at one step on both workers, worker 0 confirms,
the pods go; resumed, the job continues from that step, not from the epoch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from e2e_support import EXAMPLES, Follow, apply_example, finish
from support import TIMED, Cluster, record_timing, wait_for, wait_pods_running

pytestmark = pytest.mark.e2e


def suspend(cluster: Cluster, ns: str, on: bool) -> None:
    cluster.kubectl("patch", "dtj", "mnist-mwms", "-n", ns, "--type=merge", "-p",
                    f'{{"spec":{{"runPolicy":{{"suspend":{str(on).lower()}}}}}}}')


def test_a_suspend_saves_mid_epoch_and_the_job_resumes_at_that_step(cluster: Cluster, job_namespace: str,
                                                                       tmp_path: Path, follow: Follow) -> None:
    ns, started = job_namespace, time.monotonic()
    apply_example(cluster, ns, EXAMPLES / "multi-worker-mirrored" / "job.yaml", tmp_path,
                  env={"TRAIN_STEPS": "20000", "EPOCHS": "4"})
    logs = follow(ns, wait_pods_running(cluster, ns, "mnist-mwms", 2, timeout=180))
    logs["mnist-mwms-worker-0"].wait_event(lambda e: e.get("event") == "epoch_end", "the first epoch")
    asked = time.monotonic()
    suspend(cluster, ns, True)
    status = wait_for(lambda: (s := cluster.job_status(ns, "mnist-mwms")).get("phase") == "Suspended" and s, 90,
                      "suspended")
    stopped_in = time.monotonic() - asked
    saved = status.get("lastCheckpoint") or {}
    events = [f"{e.reason}: {e.message}" for e in cluster.events(ns, "mnist-mwms")
              if e.reason.startswith("Checkpoint")]
    TIMED.append("e2e: suspend with a checkpoint: " + "; ".join(events))
    record_timing("e2e", "suspend -> Suspended, checkpoint confirmed", stopped_in)
    assert saved.get("step"), f"no confirmed checkpoint: {status.get('message')} {events}"
    wait_for(lambda: not cluster.pods(ns, "disttrain.dev/job-name=mnist-mwms"), 120, "the pods gone")
    suspend(cluster, ns, False)
    resumed = follow(ns, wait_pods_running(cluster, ns, "mnist-mwms", 2, timeout=180))
    first = resumed["mnist-mwms-worker-0"].wait_event(lambda e: e.get("event") == "first_batch", "where it resumed")
    steps_per_epoch = 20000 // 4
    TIMED.append(f"e2e: suspend with a checkpoint: saved step {saved['step']}, resumed at {first}")
    assert first["epoch"] * steps_per_epoch + first["batch"] == saved["step"], (first, saved)
    finish(cluster, ns, "mnist-mwms", started, resumed, timing="mnist-mwms suspended mid-epoch and resumed")
