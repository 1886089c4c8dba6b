"""Jobs that follow a script (finish this pod with that code once the job runs, suspend, resume...)
whose outcome is known: the final phase and reason, the restart count, and how many pods of each
name the API server accepted. The chaos scenarios run them while they break things."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos_support import PodRecorder, mpi_small, tf_ps_small, tf_small
from kubernetes import client
from urllib3.exceptions import HTTPError

from support import Cluster

Snapshot = dict[str, tuple[dict[str, Any], list[Any]]]  # job -> (status, its pods not being deleted)


def snapshot(cluster: Cluster, ns: str) -> Snapshot:
    jobs = cluster.custom.list_namespaced_custom_object("disttrain.dev", "v1", ns, "disttrainjobs")["items"]
    pods = [p for p in cluster.pods(ns) if p.metadata.deletion_timestamp is None]
    return {j["metadata"]["name"]: (j.get("status") or {}, [p for p in pods if (p.metadata.labels or {}).get(
        "disttrain.dev/job-name") == j["metadata"]["name"]]) for j in jobs}


@dataclass
class Script:
    """A job, what the test does to it step by step, and what it must end as."""

    name: str
    manifest: dict[str, Any]
    pods: int  # pods of one attempt
    steps: list[Callable[[Cluster, str, Script, dict[str, Any], list[Any]], bool]]
    phase: str
    reason: str
    restarts: int
    attempts: dict[str, int] = field(default_factory=dict)  # pod name -> pods of that name (default 1)
    seen_uids: set[str] = field(default_factory=set)  # uids of the attempts already acted on
    pause: float = 0.0  # seconds between a step and the next: spreads the jobs' moves over the kills
    next_at: float = 0.0

    def advance(self, cluster: Cluster, ns: str, status: dict[str, Any], pods: list[Any]) -> None:
        if self.steps and time.monotonic() >= self.next_at and self.steps[0](cluster, ns, self, status, pods):
            self.steps.pop(0)
            self.next_at = time.monotonic() + self.pause

    @property
    def done(self) -> bool:
        return not self.steps


def settled(script: Script, status: dict[str, Any], pods: list[Any]) -> bool:
    """Running, every pod of a new attempt there and Running."""
    return (status.get("phase") == "Running" and len(pods) == script.pods
            and all(p.status.phase == "Running" for p in pods)
            and not {p.metadata.uid for p in pods} & script.seen_uids)


def finish(pod: str, code: int) -> Callable[[Cluster, str, Script, dict[str, Any], list[Any]], bool]:
    """Once a new attempt runs: `pod` exits with `code`."""
    def step(cluster: Cluster, ns: str, script: Script, status: dict[str, Any], pods: list[Any]) -> bool:
        if not settled(script, status, pods):
            return False
        target = next(p for p in pods if p.metadata.name == f"{script.name}-{pod}")
        script.seen_uids |= {p.metadata.uid for p in pods if p.metadata.name == target.metadata.name}
        if code != 0:  # the attempt ends: none of its pods may be acted on again
            script.seen_uids |= {p.metadata.uid for p in pods}
        return cluster.finish_pod(ns, target.metadata.name, code, target.metadata.uid) or True
    return step


def suspend(value: bool) -> Callable[[Cluster, str, Script, dict[str, Any], list[Any]], bool]:
    def step(cluster: Cluster, ns: str, script: Script, status: dict[str, Any], pods: list[Any]) -> bool:
        ready = settled(script, status, pods) if value else (status.get("phase") == "Suspended" and not pods)
        if not ready:
            return False
        script.seen_uids |= {p.metadata.uid for p in pods}
        cluster.custom.patch_namespaced_custom_object("disttrain.dev", "v1", ns, "disttrainjobs", script.name,
                                                      {"spec": {"runPolicy": {"suspend": value}}})
        return True
    return step


def scripts(copies: int) -> list[Script]:
    out: list[Script] = []
    for i in range(copies):
        tf = [f"worker-{k}" for k in range(2)]
        out += [
            Script(f"ok-{i}", tf_small(f"ok-{i}"), 2, [finish("worker-0", 0)], "Succeeded", "JobSucceeded", 0),
            Script(f"retry-{i}", tf_small(f"retry-{i}"), 2, [finish("worker-1", 137), finish("worker-0", 0)],
                   "Succeeded", "JobSucceeded", 1, {f"retry-{i}-{n}": 2 for n in tf}),
            Script(f"fatal-{i}", tf_small(f"fatal-{i}"), 2, [finish("worker-1", 1)], "Failed", "ReplicaFailed", 0),
            Script(f"backoff-{i}", tf_small(f"backoff-{i}", backoffLimit=1), 2,
                   [finish("worker-1", 137), finish("worker-0", 137)], "Failed", "BackoffLimitExceeded", 1,
                   {f"backoff-{i}-{n}": 2 for n in tf}),
            Script(f"podscope-{i}", tf_ps_small(f"podscope-{i}"), 4, [finish("worker-1", 143), finish("chief-0", 0)],
                   "Succeeded", "JobSucceeded", 1, {f"podscope-{i}-worker-1": 2}),
            Script(f"mpi-{i}", mpi_small(f"mpi-{i}"), 3, [finish("launcher", 0)], "Succeeded", "JobSucceeded", 0),
            Script(f"mpiretry-{i}", mpi_small(f"mpiretry-{i}"), 3, [finish("worker-0", 137), finish("launcher", 0)],
                   "Succeeded", "JobSucceeded", 1,
                   {f"mpiretry-{i}-{n}": 2 for n in ["launcher", "worker-0", "worker-1"]}),
            Script(f"suspend-{i}", tf_small(f"suspend-{i}"), 2, [suspend(True), suspend(False), finish("worker-0", 0)],
                   "Succeeded", "JobSucceeded", 0, {f"suspend-{i}-{n}": 2 for n in tf}),
        ]
    # podscope's worker-1 replacement: the other pods stay; its first attempt's uids are still live,
    # so its second step waits only for the new worker-1, not for a whole new attempt.
    for s in out:
        if s.name.startswith("podscope-"):
            s.steps[1] = finish_after_replacement("chief-0", "worker-1")
    return out


def finish_after_replacement(pod: str, replaced: str) -> Callable[[Cluster, str, Script, dict[str, Any], list[Any]],
                                                                   bool]:
    def step(cluster: Cluster, ns: str, script: Script, status: dict[str, Any], pods: list[Any]) -> bool:
        names = {p.metadata.name: p for p in pods}
        new = names.get(f"{script.name}-{replaced}")
        if (status.get("phase") != "Running" or len(pods) != script.pods or new is None
                or new.metadata.uid in script.seen_uids or not all(p.status.phase == "Running" for p in pods)):
            return False
        target = names[f"{script.name}-{pod}"]
        return cluster.finish_pod(ns, target.metadata.name, 0, target.metadata.uid) or True
    return step


def run_scripts(cluster: Cluster, ns: str, todo: list[Script], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    by_name = {s.name: s for s in todo}
    while True:
        try:
            snap = snapshot(cluster, ns)
            for name, (status, pods) in snap.items():
                by_name[name].advance(cluster, ns, status, pods)
        except (client.ApiException, HTTPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # the API server is down (a scenario's doing): the jobs wait, and so do we
            continue
        if all(s.done and snap[s.name][0].get("phase") == s.phase for s in todo):
            return
        if time.monotonic() > deadline:
            stuck = {s.name: (snap[s.name][0].get("phase"), len(s.steps)) for s in todo
                     if not (s.done and snap[s.name][0].get("phase") == s.phase)}
            raise AssertionError(f"jobs not at their scripted end after {timeout}s: {stuck}\n"
                                 + "\n".join(story(cluster, ns, name) for name in stuck))
        time.sleep(0.3)


def check_outcome(cluster: Cluster, ns: str, todo: list[Script], recorder: PodRecorder) -> None:
    wrong = {}
    for s in todo:
        status = cluster.job_status(ns, s.name)
        got = (status.get("phase"), status.get("reason"), status.get("restarts"))
        if got != (s.phase, s.reason, s.restarts):
            wrong[s.name] = f"{got} != {(s.phase, s.reason, s.restarts)}: {status.get('message')}"
        creations = recorder.creations(s.name)
        expected = {name: s.attempts.get(name, 1) for name in creations}
        if dict(creations) != expected:
            wrong[f"{s.name} pods"] = f"created {dict(creations)}, expected {expected}"
    assert not wrong, f"{wrong}\n" + "\n".join(story(cluster, ns, name.split()[0]) for name in wrong)


def story(cluster: Cluster, ns: str, name: str) -> str:
    """A job's events in order, and the operator's own log lines about it: why it ended elsewhere."""
    events = sorted(cluster.events(ns, name), key=lambda e: e.metadata.creation_timestamp)
    return f"{name}:\n" + "\n".join(f"  {e.metadata.creation_timestamp:%H:%M:%S} {e.reason}: {e.message}"
                                      for e in events)
