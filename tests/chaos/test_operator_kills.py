"""The operator SIGKILLed at random moments while jobs run to their end (issue 12, item 1).

Every job follows a script (finish this pod with that code once the job runs, suspend, resume...)
whose outcome is known: its final phase and reason, its restart count, and how many pods of each
name the API server accepted (a watch from the test records every pod). An operator killed
between any two of its requests must lose nothing and do nothing twice."""

from __future__ import annotations

import datetime
import os
import random
import threading
import time
from typing import Any

import pytest
from chaos_support import PodRecorder, tf_small
from scripts import check_outcome, run_scripts, scripts

from disttrain.api.objects import JobRef
from disttrain.api.observed import observe_pod
from disttrain.api.parse import parse_spec
from disttrain.decide.passes import JobState
from disttrain.decide.reconcile import reconcile
from support import Cluster, OperatorProcess, wait_for, wait_pods_running


class Killer:
    """SIGKILLs the operator `times` times, at random moments, starting it again at once."""

    def __init__(self, operator: OperatorProcess, times: int, rng: random.Random) -> None:
        self.operator, self.times, self.rng = operator, times, rng
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while self.kills < self.times and not self._stop.wait(self.rng.uniform(0.3, 3.0)):
            self.operator.kill()
            self.kills += 1
            self.operator.start()

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


KILLS = int(os.environ.get("DISTTRAIN_CHAOS_KILLS", "20"))
COPIES = int(os.environ.get("DISTTRAIN_CHAOS_COPIES", "7"))  # 8 scripts each: 56 jobs


@pytest.mark.chaos_full
def test_operator_killed_at_random_moments(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    seed = int(os.environ.get("DISTTRAIN_CHAOS_SEED", str(random.randrange(1 << 30))))
    print(f"\nseed {seed} (DISTTRAIN_CHAOS_SEED={seed} replays the kill intervals)")
    rng = random.Random(seed)
    todo = scripts(COPIES)
    rng.shuffle(todo)
    for s in todo:
        s.pause = rng.uniform(0, 8)
    recorder = PodRecorder(cluster, namespace).start()
    log_start = len(operator.log())
    started = time.monotonic()
    try:
        with Killer(operator, KILLS, rng) as killer:
            for s in todo:
                cluster.apply(s.manifest, namespace)
            run_scripts(cluster, namespace, todo, timeout=300)
            # The rest of the kills land on finished jobs: a new operator must leave them as they are.
            wait_for(lambda: killer.kills >= KILLS, KILLS * 4, f"{KILLS} kills")
        time.sleep(2)  # late pods of a wrong decision would show now
    finally:
        if operator.proc is None or operator.proc.poll() is not None:
            operator.start()
        recorder.stop()
    print(f"{len(todo)} jobs to their end in {time.monotonic() - started:.0f}s, the operator SIGKILLed "
          f"{killer.kills} times; {len(recorder.seen)} pods created")
    check_outcome(cluster, namespace, todo, recorder)
    log = operator.log()[log_start:]
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:log.index("Traceback") + 3000]


def test_a_failure_written_just_before_a_crash_is_counted_once(cluster: Cluster, operator: OperatorProcess,
                                                               namespace: str) -> None:
    """The window item 1 names, made on purpose: the operator's status write for a failure lands,
    the process dies before its deletes. The status is the one the operator computes (its pure
    reconcile, run here on the pods as they are); the next operator must not count it again."""
    ns, name = namespace, "gap"
    cluster.apply(tf_small(name, workers=3), ns)
    pods = wait_pods_running(cluster, ns, name, 3)
    job = cluster.wait_phase(ns, name, "Running") and cluster.job(ns, name)
    operator.kill()
    try:
        assert cluster.finish_pod(ns, f"{name}-worker-1", 137, next(
            p.metadata.uid for p in pods if p.metadata.name == f"{name}-worker-1"))
        failed = wait_for(lambda: (ps := cluster.pods(ns)) and any(p.status.phase == "Failed" for p in ps) and ps,
                          30, "worker 1 failed")
        meta = job["metadata"]
        state = JobState(JobRef(name, ns, meta["uid"]), meta["generation"], parse_spec(job["spec"]), job["status"])
        raw = [cluster.api.sanitize_for_serialization(p) for p in failed]
        plan = reconcile(state, [observe_pod(p) for p in raw], datetime.datetime.now(datetime.UTC))
        assert plan.status["phase"] == "Restarting" and len(plan.delete) == 3
        cluster.custom.patch_namespaced_custom_object_status("disttrain.dev", "v1", ns, "disttrainjobs", name,
                                                             {"status": plan.status})
    finally:
        operator.start()
    old = {p.metadata.uid for p in pods}

    def restarted() -> list[Any] | None:
        now = wait_pods_running(cluster, ns, name, 3)
        return now if not {p.metadata.uid for p in now} & old else None
    wait_for(restarted, 60, "the job restarted with new pods")
    status = cluster.wait_phase(ns, name, "Running")
    assert status["restarts"] == 1, f"the failure counted twice: {status}"
