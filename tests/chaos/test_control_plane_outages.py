"""etcd frozen for 10 s, then the API server restarted, while scripted jobs run (issue 12, item 2).

The operator's watches break and its requests fail meanwhile; it must reconnect and catch up on
its own, without restarting (same process), and every job must end as its script says with the
pods it should have had. The same again with two replicas under leader election (the chart's
Deployment): the leader keeps its Lease through the outage, or exits when it can't renew in time
and comes back as a standby (its pod restarted, done here by the test); the Lease is never held
by two at once, and the jobs end the same."""

from __future__ import annotations

import itertools
import random
import threading
import time
from pathlib import Path

import pytest
from chaos_support import PodRecorder
from scripts import Script, check_outcome, run_scripts, scripts

from support import OPERATOR_NAMESPACE, Cluster, OperatorProcess, log_times, wait_for

ETCD_PAUSE = 10.0


class Outages(threading.Thread):
    """A few seconds in: etcd frozen; a few seconds after it thaws: the API server restarted."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.done: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        local = self.cluster.local
        try:
            time.sleep(3)
            local.pause("etcd", ETCD_PAUSE)
            self.done.append(f"etcd paused {ETCD_PAUSE:.0f}s")
            time.sleep(4)
            started = time.monotonic()
            local.restart("kube-apiserver")
            wait_for(lambda: self.cluster.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 60,
                     "the API server back")
            self.done.append(f"API server restarted, ready again after {time.monotonic() - started:.1f}s")
        except BaseException as err:  # reported by the test: an outage not made proves nothing
            self.error = err


def through_outages(cluster: Cluster, namespace: str, rounds: int) -> tuple[list[Script], PodRecorder, Outages]:
    """Scripted jobs applied, the outages made while they run, and every job run to its end; every
    pod create recorded on the way."""
    todo = scripts(rounds)
    for s in todo:
        s.pause = random.uniform(0, 6)
    recorder = PodRecorder(cluster, namespace).start()
    outages = Outages(cluster)
    try:
        for s in todo:
            cluster.apply(s.manifest, namespace)
        outages.start()
        run_scripts(cluster, namespace, todo, timeout=300)
        outages.join(timeout=120)
        time.sleep(2)
    finally:
        recorder.stop()
    assert outages.error is None, f"the outage itself failed: {outages.error!r}"
    return todo, recorder, outages


@pytest.mark.chaos_full
def test_etcd_paused_and_api_server_restarted(cluster: Cluster, operator: OperatorProcess,
                                             namespace: str) -> None:
    assert operator.proc is not None
    pid = operator.proc.pid
    log_start = len(operator.log())
    started = time.monotonic()
    todo, recorder, outages = through_outages(cluster, namespace, 2)
    print(f"\n{len(todo)} jobs to their end in {time.monotonic() - started:.0f}s through: {'; '.join(outages.done)}")
    assert len(outages.done) == 2
    assert operator.proc.pid == pid and operator.proc.poll() is None, "the operator restarted"
    check_outcome(cluster, namespace, todo, recorder)
    log = operator.log()[log_start:]
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:log.index("Traceback") + 3000]


class Replicas(threading.Thread):
    """Operator replicas restarted when they exit, as the kubelet restarts a Deployment's pods."""

    def __init__(self, replicas: list[OperatorProcess]) -> None:
        super().__init__(daemon=True)
        self.replicas, self.restarts = replicas, 0
        self.exits: list[tuple[int, float]] = []  # (replica, wall time)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            for i, replica in enumerate(self.replicas):
                if replica.proc is not None and replica.proc.poll() is not None:
                    self.exits.append((i, time.time()))
                    self.restarts += 1
                    replica.start()

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        for replica in self.replicas:
            replica.stop()


def leaderships(replica: int, log: Path, exits: list[float]) -> list[tuple[float, float, int]]:
    """(from, to, replica) for each time the replica held the Lease: from its "became the leader"
    line to its "exiting" or "releasing Lease" line (a stopped leader gives the Lease up once kopf
    has stopped, before its process ends; logged before the release is sent), or its process's
    exit, or now."""
    text = log.read_text(errors="replace")
    ends = sorted(log_times(text, ": exiting") + log_times(text, "releasing Lease") + exits)
    spans = []
    for start in log_times(text, "became the leader"):
        end = next((e for e in ends if e >= start), time.time())
        spans.append((start, end, replica))
    return spans


@pytest.mark.chaos_full
def test_two_replicas_through_the_same_outages(cluster: Cluster, operator: OperatorProcess, namespace: str,
                                               tmp_path: Path) -> None:
    operator.stop()  # the session's operator: not leader-elected, it must not act here
    args = ("--leader-election", "--leader-election-namespace", OPERATOR_NAMESPACE, "--lease-name",
            f"dt-{namespace}", "--lease-duration", "15")
    logs = [tmp_path / f"replica-{i}.log" for i in range(2)]
    # As the chart's ServiceAccount: its Role grants Leases in its own namespace only.
    replicas = Replicas([OperatorProcess(operator.cluster, log, args) for log in logs])
    started = time.monotonic()
    try:
        for replica in replicas.replicas:
            replica.start()
        replicas.start()
        wait_for(lambda: any(log.exists() and "became the leader" in log.read_text() for log in logs), 60,
                 "a leader")
        todo, recorder, outages = through_outages(cluster, namespace, 1)
    finally:
        replicas.stop()
        operator.start()
    spans = sorted(span for i, log in enumerate(logs)
                   for span in leaderships(i, log, [t for r, t in replicas.exits if r == i]))
    print(f"\n{len(todo)} jobs to their end in {time.monotonic() - started:.0f}s with 2 replicas through: "
          f"{'; '.join(outages.done)}; leaders in turn: {[r for _, _, r in spans]}, replicas restarted "
          f"{replicas.restarts} times")
    for (_, end, before), (start, _, after) in itertools.pairwise(spans):
        assert start >= end, f"replica {after} led from {start:.3f} while replica {before} led until {end:.3f}"
    check_outcome(cluster, namespace, todo, recorder)
    for log in logs:
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, text[text.index("Traceback") - 2000:text.index("Traceback") + 3000]
