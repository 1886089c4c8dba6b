"""The progress endpoint's flood on the real plane (issue 31, item 1): 2,500 TLS connections that
send half a request line and wait, from 89 loopback addresses (many pods), held open while 20 jobs
are applied, run and succeed. Before, the endpoint ran in the controller's process and loop: the
same flood grew it from 51 to 897 MB, past the chart's 512 Mi limit. Now the endpoint is a process
of its own with a memory bound and bounded connections; this test reads both processes' memory
before, during and after, and times every job against the same 20 without the flood."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from manifests import replica, tf_job
from progress_support import FLOOD_TOOL, endpoint_pid, progress_port, rss_mib
from support import TIMED, Cluster, OperatorProcess, wait_pods_running

JOBS, CONNECTIONS = 20, 2500
ENDPOINT_BOUND_MIB, CONTROLLER_LIMIT_MIB = 384, 512  # --progress-memory-mib's default; the chart's limit


def run_jobs(cluster: Cluster, namespace: str, prefix: str) -> dict[str, float]:
    """20 jobs from apply to Succeeded (KWOK pods: worker 0 is ended by the test); seconds each."""
    started = time.monotonic()
    for i in range(JOBS):
        cluster.apply(tf_job(f"{prefix}{i}", None, worker=replica(2)), namespace)  # no GPU: 40 pods fit at once
    for i in range(JOBS):
        wait_pods_running(cluster, namespace, f"{prefix}{i}", 2)
    for i in range(JOBS):
        cluster.finish_pod(namespace, f"{prefix}{i}-worker-0", 0)
    took = {}
    for i in range(JOBS):
        cluster.wait_phase(namespace, f"{prefix}{i}", "Succeeded")
        took[f"{prefix}{i}"] = time.monotonic() - started
    return took


def test_a_connection_flood_never_slows_reconciling(cluster: Cluster, operator: OperatorProcess,
                                                    namespace: str) -> None:
    controller, endpoint = operator.proc.pid if operator.proc else 0, endpoint_pid(operator)
    calm = run_jobs(cluster, namespace, "calm")
    before = {"controller": rss_mib(controller), "endpoint": rss_mib(endpoint)}
    flood = subprocess.Popen([sys.executable, str(FLOOD_TOOL), "127.0.0.1", str(progress_port(operator)),
                              "--connections", str(CONNECTIONS), "--seconds", "150", "--sources", "127.0.0.2-90"],
                             stdout=subprocess.PIPE, text=True)
    peak = dict(before)
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak["controller"] = max(peak["controller"], rss_mib(controller))
            peak["endpoint"] = max(peak["endpoint"], rss_mib(endpoint))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        time.sleep(20)  # the flood at its height: every connection it may hold is held
        during = {"controller": rss_mib(controller), "endpoint": rss_mib(endpoint)}
        flooded = run_jobs(cluster, namespace, "flooded")
    finally:
        flood.terminate()
        out = flood.communicate(timeout=60)[0].strip()
        sampling.set()
        sampler.join()
    tally = json.loads(out.splitlines()[-1]) if out else {}
    time.sleep(5)
    after = {"controller": rss_mib(controller), "endpoint": rss_mib(endpoint)}
    said = [f"flood of {CONNECTIONS} connections: {tally}",
            f"RSS MiB (controller, endpoint): before {before}; during {during}; peak {peak}; after {after}",
            f"{JOBS} jobs apply -> Succeeded: calm {max(calm.values()):.1f}s, flooded {max(flooded.values()):.1f}s"]
    print("\n" + "\n".join(said))
    TIMED.extend(f"progress endpoint: {line}" for line in said)  # in the run's "measured" section
    assert tally.get("opened", 0) > 0, "the flood reached the endpoint"
    assert peak["controller"] - before["controller"] < 64, "the controller's memory is not the flood's"
    assert peak["controller"] < CONTROLLER_LIMIT_MIB and peak["endpoint"] < ENDPOINT_BOUND_MIB + 32
    assert max(flooded.values()) < 2 * max(calm.values()) + 30, "every job on time under the flood"
    assert endpoint_pid(operator) == endpoint, "the endpoint held its bound without being restarted"
