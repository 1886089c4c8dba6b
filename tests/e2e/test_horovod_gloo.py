"""Horovod without SSH on the real node (spec.mpi.bootstrap Gloo), from `kubectl apply`.

The Horovod Keras example's unchanged train.py on 3 workers in a namespace that enforces the
restricted Pod Security Standard (non-root, read-only root filesystem, no privilege escalation,
all capabilities dropped): it trains to Succeeded with the loss the SSH run of the same seed reaches,
and a worker killed mid-training restarts the job, which resumes from rank 0's checkpoint. The SSH
and Gloo runs are timed side by side (apply to the first training step) and their pods' memory
sampled while they train (every process of each pod's container, by name).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from e2e_support import EXAMPLES, Follow, apply_example, finish, running_with
from support import TIMED, Cluster, LogFollower, record_timing, wait_for

STEPS = "600"  # 4 epochs of 150 steps
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}
GLOO_PODS = {"horovod-gloo-worker-0", "horovod-gloo-worker-1", "horovod-gloo-worker-2"}
SSH_PODS = {"horovod-keras-launcher", "horovod-keras-worker-0", "horovod-keras-worker-1", "horovod-keras-worker-2"}


def container_memory(pod: Any) -> dict[str, Any]:
    """The pod's first container as the node sees it: its cgroup's memory use, and the resident
    memory of each process in it, summed by command name (sshd, orted, python3 ...)."""
    import realnode

    pid = realnode.container_pid(pod.status.container_statuses[0].container_id)
    path = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if line.split(":", 2)[1] == "memory")
    cgroup = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    rss: dict[str, int] = {}
    for each in cgroup.joinpath("cgroup.procs").read_text().split():
        try:
            name = Path(f"/proc/{each}/comm").read_text().strip()
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue  # gone meanwhile
        kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        rss[name] = rss.get(name, 0) + kib
    stat = dict(line.split() for line in cgroup.joinpath("memory.stat").read_text().splitlines())
    working_set = int(cgroup.joinpath("memory.usage_in_bytes").read_text()) - int(stat.get("total_inactive_file", 0))
    return {"working_set_mib": round(working_set / 2**20, 1),
            "rss_mib": {k: round(v / 1024, 1) for k, v in rss.items()}}


def sample_memory(cluster: Cluster, ns: str, names: set[str], what: str) -> float:
    """Each pod's memory while the job trains, into the run's report; the job's total working set (MiB)."""
    pods = {p.metadata.name: p for p in cluster.pods(ns, "disttrain.dev/job-name") if p.metadata.name in names}
    memory = {name: container_memory(pod) for name, pod in sorted(pods.items())}
    for name, m in memory.items():
        TIMED.append(f"e2e: {what}: {name}: working set {m['working_set_mib']} MiB, resident by process {m['rss_mib']}")
    total = sum(m["working_set_mib"] for m in memory.values())
    TIMED.append(f"e2e: {what}: the job's pods together: {total:.1f} MiB")
    return float(total)


def first_step_after(log: LogFollower, applied: float) -> float:
    step = log.wait_event(lambda e: e.get("event") == "first_step", "the first training step")
    return float(step["time"]) - applied


def final_loss(log: LogFollower) -> float:
    done = wait_for(lambda: next((e for e in log.events() if e.get("event") == "done" and e["rank"] == 0), None), 30,
                    f"rank 0's last line in {log.pod}")
    assert done["size"] == 3, done
    return float(done["final_loss"])


def restricted_namespace(cluster: Cluster, ns: str) -> None:
    cluster.core.patch_namespace(ns, {"metadata": {"labels": RESTRICTED}})


def three_ssh_workers(job: dict[str, Any]) -> None:
    mpi = job["spec"]["mpi"]
    mpi["worker"]["replicas"] = 3
    command = mpi["launcher"]["template"]["spec"]["containers"][0]["command"]
    command[command.index("-np") + 1] = "3"


@pytest.fixture(scope="module")
def ssh_run() -> dict[str, float]:
    return {}


def test_the_ssh_run_to_compare_with(cluster: Cluster, job_namespace: str, tmp_path: Path, follow: Follow,
                                     ssh_run: dict[str, float]) -> None:
    started, applied = time.monotonic(), time.time()
    apply_example(cluster, job_namespace, EXAMPLES / "horovod" / "job.yaml", tmp_path, env={"TRAIN_STEPS": STEPS},
                  edit_job=three_ssh_workers)
    pods = running_with(cluster, job_namespace, "horovod-keras", SSH_PODS)
    logs = follow(job_namespace, [p for p in pods if p.metadata.name == "horovod-keras-launcher"])
    log = logs["horovod-keras-launcher"]
    ssh_run["first_step"] = first_step_after(log, applied)
    ssh_run["memory"] = sample_memory(cluster, job_namespace, SSH_PODS, "SSH, 3 workers + launcher")
    finish(cluster, job_namespace, "horovod-keras", started, logs, timing="horovod-keras, SSH, 3 workers")
    ssh_run["loss"] = final_loss(log)
    record_timing("e2e", "apply to the first training step: SSH (3 workers)", ssh_run["first_step"])


def test_gloo_trains_under_the_restricted_standard_to_the_ssh_runs_loss(
        cluster: Cluster, job_namespace: str, tmp_path: Path, follow: Follow, ssh_run: dict[str, float]) -> None:
    restricted_namespace(cluster, job_namespace)
    started, applied = time.monotonic(), time.time()
    apply_example(cluster, job_namespace, EXAMPLES / "horovod-gloo" / "job.yaml", tmp_path,
                  env={"TRAIN_STEPS": STEPS})
    pods = running_with(cluster, job_namespace, "horovod-gloo", GLOO_PODS)
    logs = follow(job_namespace, pods)
    rank0 = logs["horovod-gloo-worker-0"]
    first_step = first_step_after(rank0, applied)
    memory = sample_memory(cluster, job_namespace, GLOO_PODS, "Gloo, 3 workers")
    for pod in pods:
        assert not [c for c in pod.spec.containers if any(p.container_port == 22 for p in c.ports or [])]
        assert pod.spec.containers[0].security_context.read_only_root_filesystem
    status = finish(cluster, job_namespace, "horovod-gloo", started, logs, timing="horovod-gloo, Gloo, 3 workers")
    assert status["restarts"] == 0 and "all 3 workers succeeded" in status["message"], status
    loss = final_loss(rank0)
    record_timing("e2e", "apply to the first training step: Gloo (3 workers)", first_step)
    TIMED.append(f"e2e: final loss, seed 42, 3 ranks: Gloo {loss!r}, SSH {ssh_run.get('loss')!r}")
    assert status["progress"]["reporter"] == "horovod-gloo-worker-0", status["progress"]
    if "loss" in ssh_run:  # the SSH run of this module
        assert loss == pytest.approx(ssh_run["loss"], rel=1e-5)
        TIMED.append(f"e2e: Gloo vs SSH: first step {first_step:.1f}s vs {ssh_run['first_step']:.1f}s, "
                     f"memory {memory:.0f} MiB vs {ssh_run['memory']:.0f} MiB")


def test_a_killed_gloo_worker_restarts_the_job_which_resumes_from_its_checkpoint(
        cluster: Cluster, job_namespace: str, tmp_path: Path, follow: Follow) -> None:
    """Worker 1's bootstrap SIGKILLed (the container's first process: its ranks die with it): 137,
    retryable under restartPolicy ExitCode; the other workers' ranks lose their peer and exit 1,
    which the killed one explains (policies/failure.py); the job restarts whole, rank 0 resumes."""
    import realnode

    restricted_namespace(cluster, job_namespace)
    started = time.monotonic()
    apply_example(cluster, job_namespace, EXAMPLES / "horovod-gloo" / "job.yaml", tmp_path,
                  env={"TRAIN_STEPS": "2400"})
    pods = running_with(cluster, job_namespace, "horovod-gloo", GLOO_PODS)
    first = follow(job_namespace, [p for p in pods if p.metadata.name == "horovod-gloo-worker-0"])
    first["horovod-gloo-worker-0"].wait_event(lambda e: e.get("event") == "epoch_end" and e["epoch"] >= 1,
                                              "two finished epochs")
    victim = next(p for p in pods if p.metadata.name == "horovod-gloo-worker-1")
    os.kill(realnode.container_pid(victim.status.container_statuses[0].container_id), signal.SIGKILL)

    old = {p.metadata.uid for p in pods}
    again = wait_for(lambda: (r := [p for p in cluster.pods(job_namespace, "disttrain.dev/job-name=horovod-gloo")
                                    if p.metadata.uid not in old and p.status.phase == "Running"
                                    and p.metadata.name == "horovod-gloo-worker-0"]) and r, 180,
                     "worker 0 made again and running", interval=0.5)
    resumed = follow(job_namespace, again)
    start = resumed["horovod-gloo-worker-0"].wait_event(lambda e: e.get("event") == "start", "where training starts")
    status = finish(cluster, job_namespace, "horovod-gloo", started, resumed, timing="horovod-gloo, killed and resumed")
    assert start["resumed"] and start["epoch"] >= 2, start
    assert status["restarts"] == 1, status
    TIMED.append(f"e2e: Gloo: resumed at {start}")
    cluster.wait_event(job_namespace, "horovod-gloo",
                       lambda e: e.reason == "PodFailed" and "worker 1" in e.message and "code 137" in e.message,
                       "the restart, naming the killed worker")
