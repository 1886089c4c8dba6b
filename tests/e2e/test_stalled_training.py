"""A hung training restarts itself (issue 46), on the real node, and its usage adds up.

Horovod (Open MPI over SSH): rank 1's process frozen mid-training by SIGSTOP. Its pod, its sshd and
its orted stay up and Kubernetes sees nothing wrong; rank 0 waits in its next allreduce for good
(Open MPI over TCP has no timeout, and Horovod's stall check only warns), so the step rank 0 reports
stops moving. The job is Stalled within its timeout, restarted whole (onStall: Restart, one restart
of backoffLimit), rank 0 resumes from the epoch it saved, and the job succeeds.

MultiWorkerMirrored: not a SIGSTOP, which stops every thread of the process, TensorFlow's
coordination-service heartbeat among them: worker 0 then exits 1 about 13 s after the freeze ("The
tasks have crashed", measured here, TF 2.21), a failure before any stall. A collective deadlock
leaves the heartbeat running and the training thread stuck, and so does stopping that one thread
(ptrace): the same Stalled, restart, resume and success.

Each run's status.usage is checked against a hand calculation from its events (`check_usage`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e_support import EXAMPLES, Follow, apply_example, finish, running_with
from support import TIMED, Cluster, record_timing, wait_for, wait_pods_running

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


def stalled_condition(cluster: Cluster, ns: str, job: str = JOB) -> dict[str, Any]:
    conditions = cluster.job_status(ns, job).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Stalled"), {})


def not_stalled(cluster: Cluster, ns: str, job: str) -> str:
    status = cluster.job_status(ns, job)
    progress = {k: v for k, v in (status.get("progress") or {}).items() if k != "history"}
    return f"{status.get('phase')}, {status.get('conditions')}, {progress}"


def resumes_and_succeeds(cluster: Cluster, ns: str, job: str, logs: dict[str, Any], reporter: str, started: float,
                         timing: str) -> None:
    """The new attempt's training starts from the epoch it saved, and the job succeeds, restarted once."""
    start = logs[reporter].wait_event(lambda e: e.get("event") == "start", "where training starts")
    TIMED.append(f"e2e: stall: {job} resumed at {start}")
    assert start["resumed"] and start["epoch"] >= 1, start
    status = finish(cluster, ns, job, started, logs, timing=timing)
    assert status["restarts"] == 1, status


@contextlib.contextmanager
def telling_the_job(cluster: Cluster, ns: str, job: str) -> Iterator[None]:
    """A wait that times out says where the job stood: a launcher that exited (Open MPI's routing
    error under a loaded node lane, 2026-11-29) or a restart before the freeze read alike from its log."""
    try:
        yield
    except AssertionError as err:
        events = [f"{e.reason}: {e.message}"[:240] for e in cluster.events(ns, job)][-8:]
        raise AssertionError(f"{err}; the job: {not_stalled(cluster, ns, job)}; its last events: {events}") from None


def stalled_then_restarted(cluster: Cluster, ns: str, job: str, frozen_at: float, what: str) -> None:
    """The job Stalled within its timeout of the freeze, and restarted for it."""
    try:
        found = wait_for(lambda: (c := stalled_condition(cluster, ns, job)).get("status") == "True" and c,
                         TIMEOUT + 60, "the Stalled condition", interval=0.5)
    except AssertionError:
        raise AssertionError(f"not Stalled: {not_stalled(cluster, ns, job)}") from None
    found_in = time.monotonic() - frozen_at
    record_timing("e2e", f"stall: {what} -> Stalled", found_in)
    TIMED.append(f"e2e: stall: {found['message']}")
    # The step stood from the last report before the freeze (at most 5 s before it): found within
    # the timeout, less that, and a pass or two more; never before.
    assert TIMEOUT - 6 <= found_in <= TIMEOUT + 20, (found_in, found)
    restart = cluster.wait_event(ns, job, lambda e: e.reason == "TrainingStalled", "the restart for it", 30)
    assert "restarting the whole job (restart 1 of" in restart.message, restart.message


def test_a_frozen_rank_stalls_the_job_which_restarts_and_resumes_from_its_checkpoint(
        cluster: Cluster, job_namespace: str, tmp_path: Path, follow: Follow) -> None:
    ns, started = job_namespace, time.monotonic()
    apply_example(cluster, ns, EXAMPLES / "horovod" / "job.yaml", tmp_path, env={"TRAIN_STEPS": str(STEPS)},
                  edit_job=stall_restarts)
    pods = running_with(cluster, ns, JOB, PODS)
    launcher = follow(ns, [p for p in pods if p.metadata.name == f"{JOB}-launcher"])[f"{JOB}-launcher"]
    with telling_the_job(cluster, ns, JOB):
        launcher.wait_event(lambda e: e.get("event") == "epoch_end", "the first epoch's end (its save)")
    old = {p.metadata.uid for p in pods}
    frozen = wait_for(lambda: rank_processes(cluster, ns, f"{JOB}-worker-1"), 30, "rank 1's process")
    frozen_at = time.monotonic()
    try:
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stalled_then_restarted(cluster, ns, JOB, frozen_at, "rank frozen")
    finally:  # continued, a deleted pod's process takes its SIGTERM at once, not the kubelet's SIGKILL later
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    again = wait_for(lambda: (r := [p for p in cluster.pods(ns, f"disttrain.dev/job-name={JOB}")
                                    if p.metadata.uid not in old and p.status.phase == "Running"
                                    and p.metadata.name == f"{JOB}-launcher"]) and r, 240,
                     "the new attempt's launcher running", interval=0.5)
    resumes_and_succeeds(cluster, ns, JOB, follow(ns, again), f"{JOB}-launcher", started,
                         "horovod-keras frozen, stalled, restarted, resumed")
    ended = stalled_condition(cluster, ns)
    assert ended.get("status") == "False", ended  # its new steps ended it, or its success did
    check_usage(cluster, ns, JOB, HOROVOD_CORES)


MWMS = "mnist-mwms"


class FrozenThread:
    """One thread of a process stopped by ptrace (PTRACE_SEIZE, then PTRACE_INTERRUPT), the rest
    left running: a training whose main thread hangs while its runtime's threads go on, as in a
    collective deadlock. (A SIGSTOP stops every thread, TensorFlow's coordination-service heartbeat
    among them: worker 0 then exits 1 about 13 s later, "The tasks have crashed".) Released by
    PTRACE_DETACH. A traced process that dies is reaped by its tracer only (the kernel shows a traced
    zombie to no one else: its container would never be seen to exit), so `release` reaps it then."""

    SEIZE, INTERRUPT, DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000

    def __init__(self, tid: int) -> None:
        import ctypes

        self.tid, self.ctypes = tid, ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        if self.libc.ptrace(self.SEIZE, tid, None, None) != 0:
            raise OSError(ctypes.get_errno(), f"ptrace SEIZE of thread {tid}")
        try:
            if self.libc.ptrace(self.INTERRUPT, tid, None, None) != 0:
                raise OSError(ctypes.get_errno(), f"ptrace INTERRUPT of thread {tid}")
            # Its stop, reported to us as its tracer; not forever (a thread in D state stops later).
            wait_for(lambda: os.waitpid(tid, os.WNOHANG | self.WALL)[0] == tid, 10, f"thread {tid} stopped",
                     interval=0.05)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self.libc.ptrace(self.DETACH, self.tid, None, None) == 0:
            return
        # Not in a stop we can detach from: gone (ESRCH), or dead and waiting for us to reap it.
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.tid, os.WNOHANG | self.WALL)


def test_a_multiworkermirrored_worker_whose_training_thread_hangs_stalls_and_resumes(
        cluster: Cluster, job_namespace: str, tmp_path: Path, follow: Follow) -> None:
    """MultiWorkerMirrored: worker 1's main thread (its Keras fit loop) frozen after an epoch's save,
    its process's other threads running; worker 0 waits in the next all-reduce, its reported step
    stands still, and the job is Stalled, restarted, resumed at its checkpoint and Succeeded."""
    import realnode

    ns, started = job_namespace, time.monotonic()
    apply_example(cluster, ns, EXAMPLES / "multi-worker-mirrored" / "job.yaml", tmp_path,
                  env={"TRAIN_STEPS": "3000", "EPOCHS": "6"}, edit_job=stall_restarts)
    first = wait_pods_running(cluster, ns, MWMS, 2, timeout=180)
    logs = follow(ns, first)
    with telling_the_job(cluster, ns, MWMS):
        logs[f"{MWMS}-worker-1"].wait_event(lambda e: e.get("event") == "epoch_end",
                                            "the first epoch's end (its save)")
    victim = next(p for p in first if p.metadata.name == f"{MWMS}-worker-1")
    main = realnode.container_pid(victim.status.container_statuses[0].container_id)
    # The container's first process is the training itself (the example's command): its main thread is Keras's.
    assert b"train.py" in Path(f"/proc/{main}/cmdline").read_bytes(), Path(f"/proc/{main}/cmdline").read_bytes()
    frozen = FrozenThread(main)
    frozen_at = time.monotonic()
    try:
        stalled_then_restarted(cluster, ns, MWMS, frozen_at, "MWMS thread frozen")
    finally:
        frozen.release()
    old = {p.metadata.uid for p in first}
    second = wait_for(lambda: (pods := wait_pods_running(cluster, ns, MWMS, 2, timeout=180))
                      and not old & {p.metadata.uid for p in pods} and pods, 180, "the new attempt's pods")
    resumes_and_succeeds(cluster, ns, MWMS, follow(ns, second), f"{MWMS}-worker-0", started,
                         "mnist-mwms thread frozen, stalled, restarted")
    check_usage(cluster, ns, MWMS, {f"{MWMS}-worker-0": 0.5, f"{MWMS}-worker-1": 0.5})


# The pods' CPU requests (examples/*/job.yaml). The node has no GPUs, so the jobs are counted in CPU
# cores, as a job without GPUs is (docs/api.md, Usage and goodput).
HOROVOD_CORES = {f"{JOB}-launcher": 0.1, f"{JOB}-worker-0": 0.5, f"{JOB}-worker-1": 0.5}


def event_times(cluster: Cluster, ns: str, job: str, reason: str) -> list[float]:
    found = sorted(float(e.first_timestamp.timestamp()) for e in cluster.events(ns, job) if e.reason == reason)
    assert found, f"no event {reason}: {[e.reason for e in cluster.events(ns, job)]}"
    return found


def event_time(cluster: Cluster, ns: str, job: str, reason: str) -> float:
    return event_times(cluster, ns, job, reason)[0]


def check_usage(cluster: Cluster, ns: str, job: str, cores: dict[str, float]) -> None:
    """Where the run's CPU-seconds went (status.usage), against a hand calculation from its events:
    the job Ran from its first AllPodsRunning to the restart for the stall (TrainingStalled), and
    from its second AllPodsRunning to JobSucceeded, every pod held all along but for a pod of the
    last attempt that ended before the job did (its containers' finishedAt, a Succeeded pod being
    kept); those seconds are training, redone and stalled, and the rest (pods up before all ran, the
    restart's teardown, the last pods going) waiting and other."""
    def settled() -> dict[str, Any] | None:
        pods = cluster.pods(ns, f"disttrain.dev/job-name={job}")
        held = [p for p in pods if p.status.phase in ("Pending", "Running")]
        usage = cluster.job_status(ns, job).get("usage") or {}
        return usage if not held and usage.get("state") == "other" else None
    wait_for(settled, 60, "the job's last pods gone", interval=1)

    def unchanged_for_8s() -> dict[str, Any] | None:  # a pod gone is counted within 5 s of its going
        first = cluster.job_status(ns, job)["usage"]
        time.sleep(8)
        return first if cluster.job_status(ns, job)["usage"] == first else None
    usage = wait_for(unchanged_for_8s, 60, "the last count written")
    split = usage["seconds"]
    TIMED.append(f"e2e: stall: {job} usage {usage}")
    assert usage["resource"] == "cpu" and abs(sum(split.values()) - usage["allocatedSeconds"]) <= 0.1 * len(split)
    ended = {p.metadata.name: max(cs.state.terminated.finished_at.timestamp() for cs in p.status.container_statuses)
             for p in cluster.pods(ns, f"disttrain.dev/job-name={job}") if p.status.phase == "Succeeded"}
    stalled = event_time(cluster, ns, job, "TrainingStalled")
    first = stalled - event_time(cluster, ns, job, "AllPodsRunning")
    second = min(t for t in event_times(cluster, ns, job, "AllPodsRunning") if t > stalled)  # the new attempt's
    done = event_time(cluster, ns, job, "JobSucceeded")
    by_hand = sum(units * (first + min(ended.get(pod, done), done) - second) for pod, units in cores.items())
    counted = split.get("training", 0) + split.get("redone", 0) + split.get("stalled", 0)
    TIMED.append(f"e2e: stall: {job}: {counted:.1f} core-seconds Running (training, redone, stalled); "
                 f"by hand from its events {by_hand:.1f}")
    # Events and finishedAt are dated to the second: up to 2 s over the two spans.
    total = sum(cores.values())
    assert abs(counted - by_hand) <= max(0.02 * by_hand, 2 * total), (counted, by_hand, ended, usage)
    # Stalled from the reporter's last report before the freeze (at most 5 s before it) to the restart.
    assert split.get("stalled", 0) >= total * (TIMEOUT - 6), usage
    assert split.get("redone", 0) > 0 and split.get("waiting", 0) > 0, usage
    assert usage["allocatedSeconds"] > by_hand
