"""Floods at the progress endpoint, on the real plane (issue 31): what any pod can send it with no
credentials. The endpoint runs in a process of its own beside the controller; these scenarios
try to make it cost the controller memory, or a job its reports:

- a storm of forged tokens (unsigned, our audience, a future expiry: each new one would need a
  TokenReview) from many pods, while a job's reporting pod sends its first report (quick: `make
  test` runs it);
- 2,000 bare TCP connections that never start TLS, then 3,000 TLS connections that send half a
  request line, while jobs are reconciled (long: `make chaos`);
- TLS handshakes as fast as they can be made, while 20 jobs are reconciled (long: `make chaos`).
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import ssl
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import aiohttp
import pytest

from disttrain.endpoint.listener import ACCEPTS_PER_SECOND
from manifests import mwms_job, replica, tf_job
from progress_support import FLOOD_TOOL, cpu_seconds, endpoint_pid, post_report, progress_port, progress_volume, rss_mib
from support import TIMED, Cluster, OperatorProcess, wait_for, wait_pods_running

JOBS = 20


def forged(n: int) -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    return ".".join([part({"alg": "RS256"}), part({"aud": ["disttrain.dev/progress"], "exp": time.time() + 3600,
                                                   "sub": f"forged-{n}"}), "x"])


async def storm(port: int, seconds: float, sources: int) -> dict[int, int]:
    """New forged tokens as fast as 8 connections from each of `sources` loopback addresses go."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    answers: dict[int, int] = {}
    deadline, counter = time.monotonic() + seconds, iter(range(10**9))
    url = f"https://127.0.0.1:{port}/apis/disttrain.dev/v1/namespaces/x/disttrainjobs/y/progress"

    async def sender(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            try:
                async with session.post(url, json={"epoch": 1},
                                        headers={"Authorization": f"Bearer {forged(next(counter))}"}) as resp:
                    answers[resp.status] = answers.get(resp.status, 0) + 1
            except aiohttp.ClientError:
                answers[0] = answers.get(0, 0) + 1

    async def one_source(n: int) -> None:
        connector = aiohttp.TCPConnector(ssl=context, local_addr=(f"127.0.0.{n}", 0), limit=8)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(sender(session) for _ in range(8)))
    await asyncio.gather(*(one_source(n) for n in range(2, 2 + sources)))
    await asyncio.sleep(0.25)  # a closed session's TLS transports finish closing on the loop (aiohttp's advice)
    return answers


def storm_and_sweep(port: int, seconds: float, sources: int, answers: dict[int, int]) -> None:
    """The storm, then what its loop left unclosed collected here, quietly: a TLS transport still
    shutting down when asyncio.run closed the loop was collected in the next test and failed it
    (PytestUnraisableExceptionWarning: unclosed transport 127.0.0.9 -> the endpoint, in
    test_secrets_stay_secret, the clean-clone run of b01ea04)."""
    answers.update(asyncio.run(storm(port, seconds, sources)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_a_forged_token_storm_leaves_a_jobs_first_report_accepted(cluster: Cluster, operator: OperatorProcess,
                                                                  namespace: str, tmp_path: Path) -> None:
    """Before, forged tokens held the cluster-wide TokenReview budget empty (refusals were not
    remembered, and cost the forger nothing): every legitimate new token got 503 while it lasted."""
    cluster.apply(mwms_job("first", workers=2), namespace)
    wait_pods_running(cluster, namespace, "first", 2)
    volume = progress_volume(cluster, namespace, "first-worker-0", tmp_path)
    port = progress_port(operator)
    answers: dict[int, int] = {}
    stormer = threading.Thread(target=storm_and_sweep, args=(port, 15, 10, answers))
    stormer.start()
    time.sleep(5)  # the storm at its height
    started = time.monotonic()
    first = post_report(volume, {"epoch": 1})
    took = time.monotonic() - started
    stormer.join()
    said = f"forged-token storm: {answers}; the job's first report: {first[0]} in {took:.2f}s"
    print("\n" + said)
    TIMED.append(f"progress endpoint: {said}")
    assert first[0] == 202, first
    assert answers.get(401, 0) + answers.get(503, 0) > 100, "the storm reached the endpoint"


@pytest.mark.chaos_full
def test_floods_of_connections_cost_the_controller_nothing(cluster: Cluster, operator: OperatorProcess,
                                                           namespace: str) -> None:
    controller, endpoint = operator.proc.pid if operator.proc else 0, endpoint_pid(operator)
    port = progress_port(operator)
    for how, count in (("--no-handshake", 2000), ("", 3000)):
        before = {"controller": rss_mib(controller), "endpoint": rss_mib(endpoint)}
        flood = subprocess.Popen([sys.executable, str(FLOOD_TOOL), "127.0.0.1", str(port), "--connections",
                                  str(count), "--seconds", "40", "--sources", "127.0.0.2-90",
                                  *([how] if how else [])], stdout=subprocess.PIPE, text=True)
        time.sleep(20)
        during = {"controller": rss_mib(controller), "endpoint": rss_mib(endpoint)}
        name = f"during{'-bare' if how else '-tls'}"
        cluster.apply(mwms_job(name, workers=2), namespace)
        wait_pods_running(cluster, namespace, name, 2, timeout=60)
        tally = json.loads(flood.communicate(timeout=120)[0].strip().splitlines()[-1])
        print(f"\n{count} {'bare TCP' if how else 'TLS'} connections: {tally}; RSS MiB before {before}, "
              f"during {during}")
        assert during["controller"] - before["controller"] < 64
        assert during["endpoint"] < 384
    assert endpoint_pid(operator) == endpoint, "the endpoint held its bound without being restarted"


def time_jobs(cluster: Cluster, namespace: str, prefix: str, timeout: float = 180) -> float:
    """Seconds from applying JOBS jobs to all their pods Running: what reconciling takes."""
    started = time.monotonic()
    for i in range(JOBS):
        cluster.apply(tf_job(f"{prefix}{i}", None, worker=replica(2)), namespace)  # no GPU: 40 pods fit at once
    for i in range(JOBS):
        wait_pods_running(cluster, namespace, f"{prefix}{i}", 2, timeout=max(1.0, started + timeout - time.monotonic()))
    return time.monotonic() - started


def clear_jobs(cluster: Cluster, namespace: str) -> None:
    """The calm run's jobs deleted and their pods gone: the flooded run gets the same free nodes.
    (Kept, their 40 pods filled the KWOK nodes and the 13th flooded job's pods never ran: the
    failure earlier runs of this test put down to the flood.)"""
    cluster.kubectl("delete", "disttrainjobs", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
    wait_for(lambda: not cluster.pods(namespace), 120, f"the pods of {namespace} gone")


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def spent(before: dict[str, float], after: dict[str, float], seconds: float) -> str:
    return ", ".join(f"{name} {after[name] - before[name]:.1f} s ({100 * (after[name] - before[name]) / seconds:.0f}%)"
                     for name in before)


@pytest.mark.chaos_full
def test_a_handshake_flood_leaves_reconciling_on_time(cluster: Cluster, operator: OperatorProcess,
                                                      namespace: str) -> None:
    """TLS handshakes as fast as 64 connections from 8 addresses can make them (issue 43, item 3).
    Unbounded and unniced, ~1,700 a second (0.6 ms each) took the CPU the controller shares with the
    endpoint; now each address is accepted at most ACCEPTS_PER_SECOND and the endpoint runs at nice
    10: 20 jobs reconcile within 1.5x of their time without the flood, and the controller's CPU,
    the endpoint's and the flood's own are measured over both.

    The flood runs at nice 19. In a cluster it comes from pods on other nodes, whose CPU is not the
    operator's; here it shares this machine's two cores with the API server, etcd, KWOK and the
    operator, and unniced its own handshakes and retries (a refused connection is retried at once)
    would take a core from the plane: what is measured is what the endpoint costs the controller,
    not what the attacker's CPU costs this machine."""
    pids = {"controller": operator.proc.pid if operator.proc else 0, "endpoint": endpoint_pid(operator)}
    before = cpu_of(pids)
    calm = time_jobs(cluster, namespace, "calm")
    during_calm = cpu_of(pids)
    clear_jobs(cluster, namespace)
    timeout = max(180, 3 * calm)
    flood = subprocess.Popen(["nice", "-n", "19", sys.executable, str(FLOOD_TOOL), "127.0.0.1",
                              str(progress_port(operator)), "--connections", "64", "--seconds", str(int(timeout) + 60),
                              "--sources", "127.0.0.2-9", "--churn"], stdout=subprocess.PIPE, text=True)
    pids["flood"], flood_started = flood.pid, time.monotonic()
    try:
        time.sleep(5)  # the flood at its height
        at_height = cpu_of(pids)
        flooded = time_jobs(cluster, namespace, "flooded", timeout=timeout)
        after = cpu_of(pids)
    finally:
        flood.terminate()
        out = flood.communicate(timeout=60)[0].strip()
        flood_seconds = time.monotonic() - flood_started
    tally = json.loads(out.splitlines()[-1]) if out else {}
    said = (f"handshake flood {tally}: {JOBS} jobs apply -> pods Running: calm {calm:.1f}s "
            f"({spent(before, during_calm, calm)}), flooded {flooded:.1f}s ({spent(at_height, after, flooded)})")
    print("\n" + said)
    TIMED.append(f"progress endpoint: {said}")
    # Saturated: it offered more than the 8 addresses' accept bound (8 x ACCEPTS_PER_SECOND = 160 a
    # second) and got about that bound's handshakes, niced as it is (here: ~1,000 offered, ~155 made).
    made = tally.get("opened", 0) / flood_seconds
    offered = made + tally.get("failed", 0) / flood_seconds
    assert offered > 2 * 8 * ACCEPTS_PER_SECOND and made > 0.5 * 8 * ACCEPTS_PER_SECOND, (offered, made, said)
    assert flooded <= 1.5 * calm, said
