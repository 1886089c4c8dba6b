"""The work a stop loses, with and without the checkpoint before it (issue 33): `make
bench-checkpoint` (a real node; about 15 minutes). Not collected by `make test` (the name isn't
test_*): a benchmark, its numbers in bench/results.checkpoint.{json,md}.

Method. The multi-worker-mirrored example (2 workers, 20000 steps an epoch, about 150 steps a
second on this machine's 2 cores) is stopped at step 6000 of its first epoch by a suspend, a Kueue
preemption (a higher-priority job in a ClusterQueue it fills) and a drained pod (the Eviction API
on worker 1), and resumed. Each stop in three setups:
- `none`: as before issue 33, `checkpointGraceSeconds: 0` and the Keras hook off
  (DISTTRAIN_KERAS_HOOK=0): the training resumes from its last epoch-end backup (here none: step 0).
  Its python, the container's PID 1, ignores SIGTERM and trains on until the kubelet's SIGKILL 30 s
  later;
- `sigterm`: `checkpointGraceSeconds: 0`, the hook on: the pods save on their SIGTERM alone;
- `request`: the default (30 s): the operator asks first and waits for the confirmation.
Steps redone = the last step worker 0 logged before its pod ended (LOG_EVERY_STEPS=10: up to 9
more may have run unlogged) - the step the resumed training starts at. Stop to pods gone: from the
stop (the patch, the higher-priority job applied, the eviction) to none of the old pods left."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e_support import EXAMPLES, Follow, apply_example
from support import ROOT, Cluster, wait_for, wait_pods_running

from .test_checkpoint_before_stop import JOB, full_queue, suspend, uids, urgent_job

pytestmark = pytest.mark.e2e
# Epochs of 20000 steps (about two minutes here), stopped 6000 steps into the first: an epoch far
# longer than the 30 s a pod ignoring SIGTERM trains on, as a real training's are.
STEPS, EPOCHS, STOP_AT = 40000, 2, 6000
RESULTS = ROOT / "bench" / "results.checkpoint"  # .json and .md
SETUPS = {"none": (0, "0"), "sigterm": (0, "1"), "request": (30, "1")}


def logged_steps(lines: list[str]) -> list[int]:
    steps = []
    for line in lines:
        if line.startswith('{"event": "step"'):
            steps.append(int(json.loads(line)["step"]))
    return steps


def stop(cluster: Cluster, ns: str, how: str) -> None:
    if how == "suspend":
        suspend(cluster, ns, True)
    elif how == "preemption":
        cluster.kubectl("apply", "-f", "-", input=json.dumps(urgent_job(ns)))
    else:
        cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{ns}/pods/{JOB}-worker-1/eviction", "-f", "-",
                        input=json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                                          "metadata": {"name": f"{JOB}-worker-1", "namespace": ns}}))


def resume(cluster: Cluster, ns: str, how: str) -> None:
    if how == "suspend":
        wait_for(lambda: cluster.job_status(ns, JOB).get("phase") == "Suspended", 120, "suspended")
        suspend(cluster, ns, False)
    # A preempted job is admitted again when the urgent one is done; a drained one restarts at once.


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("how", ["suspend", "preemption", "drain"])
def test_lost_work(cluster: Cluster, job_namespace: str, tmp_path: Path, follow: Follow, how: str,
                   setup: str) -> None:
    ns, (grace, hook) = job_namespace, SETUPS[setup]
    labels = {"kueue.x-k8s.io/queue-name": "team", "kueue.x-k8s.io/priority-class": f"low-{ns}"}
    if how == "preemption":
        full_queue(cluster, ns)

    def edit_job(job: dict[str, Any]) -> None:
        job["spec"]["runPolicy"]["checkpointGraceSeconds"] = grace
        if how == "preemption":
            job["metadata"].setdefault("labels", {}).update(labels)
    apply_example(cluster, ns, EXAMPLES / "multi-worker-mirrored" / "job.yaml", tmp_path, edit_job=edit_job,
                  env={"TRAIN_STEPS": str(STEPS), "EPOCHS": str(EPOCHS), "LOG_EVERY_STEPS": "10",
                       "DISTTRAIN_KERAS_HOOK": hook})
    logs = follow(ns, wait_pods_running(cluster, ns, JOB, 2, timeout=180))[f"{JOB}-worker-0"]
    logs.wait_event(lambda e: e.get("event") == "step" and e["step"] >= STOP_AT, "the stop's step")
    old, stopped = uids(cluster, ns), time.monotonic()
    stop(cluster, ns, how)
    wait_for(lambda: not uids(cluster, ns) & old, 180, "the old pods gone", interval=0.2)
    gone_in = time.monotonic() - stopped
    time.sleep(2)  # the log's last lines
    reached = max(logged_steps(logs.lines))
    resume(cluster, ns, how)
    resumed = follow(ns, wait_pods_running(cluster, ns, JOB, 2, timeout=300))[f"{JOB}-worker-0"]
    first = resumed.wait_event(lambda e: e.get("event") == "first_batch", "where it resumed")
    at = first["epoch"] * (STEPS // EPOCHS) + first["batch"]
    status = cluster.job_status(ns, JOB)
    record({"stop": how, "setup": setup, "checkpointGraceSeconds": grace, "hook": hook == "1",
            "reached": reached, "resumedAt": at, "redone": reached - at, "stopToPodsGoneSeconds": round(gone_in, 1),
            "lastCheckpoint": status.get("lastCheckpoint")})
    cluster.kubectl("delete", "dtj", JOB, "-n", ns, "--wait=false")
    if how == "preemption":
        for kind, name in (("clusterqueue", f"cq-{ns}"), ("resourceflavor", f"fl-{ns}"),
                           ("workloadpriorityclass", f"low-{ns}"), ("workloadpriorityclass", f"high-{ns}")):
            cluster.kubectl("delete", kind, name, "--wait=false", check=False)


def record(row: dict[str, Any]) -> None:
    """Rows of this run (the file is started afresh by the first of them, within an hour)."""
    path = RESULTS.parent / f"{RESULTS.name}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() and time.time() - path.stat().st_mtime < 3600 else []
    rows = [r for r in rows if (r["stop"], r["setup"]) != (row["stop"], row["setup"])] + [row]
    path.write_text(json.dumps({"method": __doc__, "rows": rows}, indent=1) + "\n")
    table = ["| stop | setup | step reached | resumed at | steps redone | stop to pods gone (s) |",
             "|---|---|---:|---:|---:|---:|"]
    table += [f"| {r['stop']} | {r['setup']} | {r['reached']} | {r['resumedAt']} | {r['redone']} | "
              f"{r['stopToPodsGoneSeconds']} |" for r in rows]
    (RESULTS.parent / f"{RESULTS.name}.md").write_text("# Work lost to a stop, with and without a checkpoint first\n\n"
                                          + "\n".join(table) + "\n\n" + str(__doc__) + "\n")
    print(yaml.safe_dump(row))
