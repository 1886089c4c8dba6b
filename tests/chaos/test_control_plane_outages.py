"""etcd frozen for 10 s, then the API server restarted, while scripted jobs run (issue 12, item 2).

The operator's watches break and its requests fail meanwhile; it must reconnect and catch up on
its own, without restarting (same process), and every job must end as its script says with the
pods it should have had."""

from __future__ import annotations

import random
import threading
import time

import pytest
from chaos_support import PodRecorder
from scripts import check_outcome, run_scripts, scripts

from support import Cluster, OperatorProcess, wait_for

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


@pytest.mark.chaos_full
def test_etcd_paused_and_api_server_restarted(cluster: Cluster, operator: OperatorProcess,
                                             namespace: str) -> None:
    assert operator.proc is not None
    pid = operator.proc.pid
    todo = scripts(2)
    for s in todo:
        s.pause = random.uniform(0, 6)
    recorder = PodRecorder(cluster, namespace).start()
    log_start = len(operator.log())
    outages = Outages(cluster)
    started = time.monotonic()
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
    print(f"\n{len(todo)} jobs to their end in {time.monotonic() - started:.0f}s through: {'; '.join(outages.done)}")
    assert len(outages.done) == 2
    assert operator.proc.pid == pid and operator.proc.poll() is None, "the operator restarted"
    check_outcome(cluster, namespace, todo, recorder)
    log = operator.log()[log_start:]
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:log.index("Traceback") + 3000]
