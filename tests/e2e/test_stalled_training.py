"""A hung training restarts itself (issue 46), on the real node: the Horovod example (Open MPI over
SSH), rank 1's process frozen mid-training by SIGSTOP. Its pod, its sshd and its orted stay up and
Kubernetes sees nothing wrong; rank 0 waits in its next allreduce for good (Open MPI over TCP has no
timeout, and Horovod's stall check only warns), so the step rank 0 reports stops moving. The job is
Stalled within its timeout, restarted whole (onStall: Restart, one restart of backoffLimit), rank 0
resumes from the epoch it saved, and the job succeeds.

Not MultiWorkerMirrored: there TensorFlow's coordination service finds a frozen task by its missed
heartbeats, and worker 0 exits 1 ("The tasks have crashed") about 13 s after the freeze (measured
here, TF 2.21): a failure, judged by restartPolicy, before any stall could be."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from e2e_support import EXAMPLES, Follow, apply_example, finish, running_with
from support import TIMED, Cluster, record_timing, wait_for

pytestmark = pytest.mark.e2e
JOB = "horovod-keras"
PODS = {f"{JOB}-launcher", f"{JOB}-worker-0", f"{JOB}-worker-1"}
STEPS, EPOCHS = 4800, 4  # 1,200 steps an epoch: several seconds each here, for the freeze to land in
# Long enough that neither an epoch's end (its save) nor a loaded machine's steps read as still (the
# hook reports every 5 s), short enough for the suite: found about 25 s after the freeze. An
# attempt's first step gets three of it (75 s): mpirun's start over SSH, TensorFlow's, the restore.
TIMEOUT = 25


def rank_processes(cluster: Cluster, ns: str, pod: str) -> list[int]:
    """The host PIDs of the training processes (`python .../train.py`) in the pod's container, which
    sshd and orted started: they share its PID namespace, not its main process's tree alone."""
    import realnode

    status = cluster.core.read_namespaced_pod(pod, ns).status
    main = realnode.container_pid(status.container_statuses[0].container_id)
    namespace = os.readlink(f"/proc/{main}/ns/pid")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/ns/pid") == namespace and \
                    b"train.py" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


def stall_restarts(job: dict[str, Any]) -> None:
    job["spec"].setdefault("runPolicy", {}).update(stallTimeoutSeconds=TIMEOUT, onStall="Restart")


def stalled_condition(cluster: Cluster, ns: str) -> dict[str, Any]:
    conditions = cluster.job_status(ns, JOB).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Stalled"), {})


def not_stalled(cluster: Cluster, ns: str) -> str:
    status = cluster.job_status(ns, JOB)
    progress = {k: v for k, v in (status.get("progress") or {}).items() if k != "history"}
    return f"{status.get('phase')}, {status.get('conditions')}, {progress}"


def test_a_frozen_rank_stalls_the_job_which_restarts_and_resumes_from_its_checkpoint(
        cluster: Cluster, job_namespace: str, tmp_path: Path, follow: Follow) -> None:
    ns, started = job_namespace, time.monotonic()
    apply_example(cluster, ns, EXAMPLES / "horovod" / "job.yaml", tmp_path, env={"TRAIN_STEPS": str(STEPS)},
                  edit_job=stall_restarts)
    pods = running_with(cluster, ns, JOB, PODS)
    launcher = follow(ns, [p for p in pods if p.metadata.name == f"{JOB}-launcher"])[f"{JOB}-launcher"]
    launcher.wait_event(lambda e: e.get("event") == "epoch_end", "the first epoch's end (its save)")
    old = {p.metadata.uid for p in pods}
    frozen = wait_for(lambda: rank_processes(cluster, ns, f"{JOB}-worker-1"), 30, "rank 1's process")
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        try:
            found = wait_for(lambda: (c := stalled_condition(cluster, ns)).get("status") == "True" and c,
                             TIMEOUT + 60, "the Stalled condition", interval=0.5)
        except AssertionError:
            raise AssertionError(f"not Stalled: {not_stalled(cluster, ns)}") from None
        found_in = time.monotonic() - frozen_at
        record_timing("e2e", "stall: rank frozen -> Stalled", found_in)
        TIMED.append(f"e2e: stall: {found['message']}")
        # The step stood from the last report before the freeze (at most 5 s before it): found within
        # the timeout, less that, and a pass or two more; never before.
        assert TIMEOUT - 6 <= found_in <= TIMEOUT + 20, (found_in, found)
        restart = cluster.wait_event(ns, JOB, lambda e: e.reason == "TrainingStalled", "the restart for it", 30)
        assert "restarting the whole job (restart 1 of" in restart.message, restart.message
    finally:  # continued, a deleted pod's process takes its SIGTERM at once, not the kubelet's SIGKILL later
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    again = wait_for(lambda: (r := [p for p in cluster.pods(ns, f"disttrain.dev/job-name={JOB}")
                                    if p.metadata.uid not in old and p.status.phase == "Running"
                                    and p.metadata.name == f"{JOB}-launcher"]) and r, 240,
                     "the new attempt's launcher running", interval=0.5)
    resumed = follow(ns, again)
    start = resumed[f"{JOB}-launcher"].wait_event(lambda e: e.get("event") == "start", "where training starts")
    TIMED.append(f"e2e: stall: resumed at {start}")
    assert start["resumed"] and start["epoch"] >= 1, start
    status = finish(cluster, ns, JOB, started, resumed, timing="horovod-keras frozen, stalled, restarted, resumed")
    assert status["restarts"] == 1, status
    ended = stalled_condition(cluster, ns)
    assert ended.get("status") == "False", ended  # its new steps ended it, or its success did
