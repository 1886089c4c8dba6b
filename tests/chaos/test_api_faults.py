"""Faults the API server makes only when something stands in its way (issue 21): the operator
talks to it through a fault-injecting proxy (faultproxy.py) or meets a webhook that refuses.

- deletes answered 429 (with Retry-After) or 500 after they were carried out, creates whose
  answer is lost after the pod was made, status writes answered 500: every scripted job still
  ends as its script says, with exactly the pods it should have had, and no pod is left running;
- the pod watch expired (410) while pods were deleted and the re-list held until they were gone:
  no DELETED event ever reaches the operator, the resync finds them gone (tombstones.py);
- a webhook denying pod creates with a 400, then allowing them: the jobs say so (reason, event
  naming the webhook), wait with backoff, and run once it allows.

In each, the operator's log has no traceback: every failure was told apart and said in a line.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chaos_support import PodRecorder, mpi_small, tf_ps_small, tf_small
from cryptography.x509.oid import ExtendedKeyUsageOID
from denying_webhook import MESSAGE, NAME, DenyingWebhook
from faultproxy import Fault, FaultProxy
from scripts import Script, check_outcome, finish, finish_after_replacement, run_scripts, scripts, settled, snapshot

from pki import issue, subject
from support import Cluster, OperatorProcess, wait_for

RESYNC_SECONDS = 5


@pytest.fixture
def local_cert(cluster: Cluster) -> tuple[Path, Path, Path]:
    """A serving certificate for 127.0.0.1 signed by the cluster's CA: (cert, key, CA)."""
    if cluster.local is None:
        pytest.skip("needs the local control plane (its CA signs the proxy's and the webhook's certificates)")
    pki = Path(cluster.local.root) / "pki"
    # Issued anew each time: a plane started afresh has a new CA.
    issue(pki, "chaos-local", subject("chaos-local"), ips=["127.0.0.1"], usage=[ExtendedKeyUsageOID.SERVER_AUTH])
    return pki / "chaos-local.crt", pki / "chaos-local.key", pki / "ca.crt"


@pytest.fixture
def proxied(cluster: Cluster, operator: OperatorProcess, local_cert: tuple[Path, Path, Path],
            tmp_path: Path) -> Iterator[tuple[FaultProxy, OperatorProcess]]:
    """The operator as the session's (the chart's identity), but through the proxy, resyncing its
    pods every few seconds; the session's own operator stopped meanwhile."""
    cert, key, ca = local_cert
    proxy = FaultProxy(cluster.local.server, ca, cert, key).start()
    config = yaml.safe_load(operator.cluster.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = proxy.url
    kubeconfig = tmp_path / "proxied.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    kubeconfig.chmod(0o600)
    operator.stop()
    proxied_operator = OperatorProcess(Cluster(kubeconfig=kubeconfig, local=cluster.local), tmp_path / "operator.log",
                                       ("--resync-seconds", str(RESYNC_SECONDS)))
    proxied_operator.start()
    try:
        yield proxy, proxied_operator
    finally:
        proxied_operator.stop()
        proxy.stop()
        operator.start()


def no_traceback(operator: OperatorProcess) -> None:
    log = operator.log()
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:log.index("Traceback") + 3000]


def nothing_left_running(cluster: Cluster, namespace: str) -> None:
    """Finished jobs keep no running pod (cleanPodPolicy Running): a delete refused was made again."""
    def left() -> list[str]:
        return [p.metadata.name for p in cluster.pods(namespace)
                if p.status.phase in ("Pending", "Running") and p.metadata.deletion_timestamp is None]
    wait_for(lambda: not left() or None, 60, "no pod left running")


def test_deletes_refused_or_lost_creates_and_status_writes_failing(cluster: Cluster, namespace: str,
                                                                 proxied: tuple[FaultProxy, OperatorProcess]) -> None:
    proxy, operator = proxied
    faults = [
        proxy.inject(Fault("DELETE", "pods", 429, rate=0.5, seed=1)),
        proxy.inject(Fault("DELETE", "pods", 500, rate=0.5, seed=2, after_forwarding=True)),
        proxy.inject(Fault("POST", "pods", 500, rate=0.25, seed=3, after_forwarding=True)),
        proxy.inject(Fault("PATCH", "disttrainjobs", 500, rate=0.2, seed=4, subresource="status")),
    ]
    todo = scripts(2)
    recorder = PodRecorder(cluster, namespace).start()
    started = time.monotonic()
    try:
        for s in todo:
            cluster.apply(s.manifest, namespace)
        run_scripts(cluster, namespace, todo, timeout=240)
        nothing_left_running(cluster, namespace)
    finally:
        recorder.stop()
    answered = {f"{f.method} {f.resource}{'/' + f.subresource if f.subresource else ''} {f.code}"
                f"{' after' if f.after_forwarding else ''}": f.answered for f in faults}
    print(f"\n{len(todo)} jobs to their end in {time.monotonic() - started:.0f}s; faults answered: {answered}")
    assert all(answered.values()), f"a fault never fired, so proves nothing: {answered}"
    check_outcome(cluster, namespace, todo, recorder)
    told = {e.message for s in todo for e in cluster.events(namespace, s.name) if e.reason == "APIRequestRetried"}
    assert any(m.startswith("throttled (429)") for m in told), f"no job was told of a 429: {told}"
    no_traceback(operator)


def delete_behind_the_watch(cluster: Cluster, namespace: str, proxy: FaultProxy, pods: list[str]) -> None:
    """The operator's pod watch expires; while its re-list is held, `pods` are deleted and gone."""
    with proxy.lists_held("pods"):
        assert proxy.expire_watches("pods") >= 1, "the operator had no pod watch open through the proxy"
        for pod in pods:
            cluster.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
        wait_for(lambda: not {p.metadata.name for p in cluster.pods(namespace)} & set(pods) or None, 30,
                 "the deleted pods gone from the API server")


def test_pods_deleted_while_the_pod_watch_was_expired(cluster: Cluster, namespace: str,
                                                     proxied: tuple[FaultProxy, OperatorProcess]) -> None:
    proxy, operator = proxied
    workers = ["worker-0", "worker-1"]
    todo = [
        Script("gap-tf", tf_small("gap-tf"), 2, [finish("worker-0", 0)], "Succeeded", "JobSucceeded", 1,
               {f"gap-tf-{n}": 2 for n in workers}),
        Script("gap-pod", tf_ps_small("gap-pod"), 4, [finish("chief-0", 0)], "Succeeded", "JobSucceeded", 1,
               {"gap-pod-worker-1": 2}),
        Script("gap-mpi", mpi_small("gap-mpi"), 3, [finish("launcher", 0)], "Succeeded", "JobSucceeded", 1,
               {f"gap-mpi-{n}": 2 for n in ["launcher", *workers]}),
    ]
    recorder = PodRecorder(cluster, namespace).start()
    try:
        for s in todo:
            cluster.apply(s.manifest, namespace)
        wait_for(lambda: all(settled(s, *snapshot(cluster, namespace)[s.name]) for s in todo), 90, "every job running")
        first = {s.name: {p.metadata.uid for p in snapshot(cluster, namespace)[s.name][1]} for s in todo}
        for s in todo:  # the next step waits for a new attempt (gap-pod: only its worker-1 is new)
            s.seen_uids |= first[s.name]
        delete_behind_the_watch(cluster, namespace, proxy, ["gap-tf-worker-1", "gap-pod-worker-1", "gap-mpi-worker-0"])
        started = time.monotonic()
        todo[1].steps[0] = finish_after_replacement("chief-0", "worker-1")
        run_scripts(cluster, namespace, todo, timeout=60 + 3 * RESYNC_SECONDS)
        print(f"\nthe lost pods found gone and the jobs finished {time.monotonic() - started:.0f}s after the gap; "
              f"watches expired: {dict(proxy.expired)}")
    finally:
        recorder.stop()
    check_outcome(cluster, namespace, todo, recorder)
    # Found by the pod watch's re-list after the 410 (podwatch.py), which replaces what it held; before
    # the operator had its own watch, kopf's re-list kept them and the tombstones' resync purged them.
    assert "expired, listing again" in operator.log()
    no_traceback(operator)


def refused(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    status = cluster.job_status(namespace, name)
    return status if status.get("reason") == "PodCreateRefused" else None


def test_a_webhook_denies_pod_creates_with_a_400_then_allows_them(cluster: Cluster, namespace: str,
                                                                 operator: OperatorProcess,
                                                                 local_cert: tuple[Path, Path, Path]) -> None:
    cert, key, ca = local_cert
    webhook = DenyingWebhook(cert, key, ca).start()
    configuration = webhook.configuration(namespace)
    todo = [s for s in scripts(1) if s.name in ("ok-0", "retry-0", "mpi-0", "fatal-0")]
    recorder = PodRecorder(cluster, namespace).start()
    log_start = len(operator.log())
    try:
        cluster.apply(configuration)
        # In force once a server-side dry run of a pod is denied (the API server loads webhooks
        # from a watch of its own).
        probe = ["run", "probe", "--image=busybox", "--restart=Never", "--dry-run=server", "-n", namespace]
        wait_for(lambda: NAME in cluster.kubectl(*probe, check=False).stderr, 30, "the webhook in force")
        webhook.denied = 0
        for s in todo:
            cluster.apply(s.manifest, namespace)
        for s in todo:
            status = wait_for(functools.partial(refused, cluster, namespace, s.name), 60,
                              f"{s.name} saying its pods are refused")
            assert NAME in status["message"] and MESSAGE in status["message"], status["message"]
            assert status["phase"] == "Pending", status
            cluster.wait_event(namespace, s.name, lambda e: e.reason == "PodCreateRefused" and NAME in e.message,
                               "a Warning event naming the webhook")
        time.sleep(5)  # a few refusals more: backoff, not a hot loop
        denials = webhook.denied
        assert denials <= 12 * len(todo), f"{denials} creates refused in ~5 s: no backoff"
        webhook.deny = False
        run_scripts(cluster, namespace, todo, timeout=120)
    finally:
        recorder.stop()
        cluster.kubectl("delete", "validatingwebhookconfiguration", configuration["metadata"]["name"],
                        "--ignore-not-found")
        webhook.stop()
    print(f"\n{denials} pod creates denied with a 400, then {webhook.allowed} allowed")
    check_outcome(cluster, namespace, todo, recorder)
    log = operator.log()[log_start:]
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:log.index("Traceback") + 3000]
