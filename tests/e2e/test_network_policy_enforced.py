"""NetworkPolicy enforced on the real node (issue 32): kube-router's firewall (hack/netpolicy.py)
programs the node's iptables from the API's NetworkPolicies, so a job's `runPolicy.networkPolicy`
and the chart's policy for the progress endpoint do what they say, with real pods:

- a job with the policy (egress PeersAndDNS) trains, its peers reaching each other, its reporter
  reaching the operator's endpoint, names resolving; a pod of another job is refused at its
  workers' port, within seconds;
- the same probe, from the same pod, against a job without the policy connects;
- the operator's progress port admits a DistTrainJob's pod and refuses a bare pod.

Each probe is a connection attempt from inside a pod (`kubectl exec`), its outcome printed as a
line (`allowed`/`denied`, with the time it took), repeated until the outcomes are those expected
(the firewall takes a new pod in with its next sync) for up to CONVERGE seconds; the lines are kept
for the issue's note in .cache/e2e-last-lines/network-policy-probes.txt.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from disttrain.api.defaults import TF_PORT
from e2e_support import EXAMPLES, LAST_LINES, Follow, apply_example, finish
from manifests import TF_IMAGE
from support import ROOT, TIMED, Cluster, record_timing, wait_for, wait_pods_running

pytestmark = pytest.mark.e2e

# Each target HOST:PORT is connected to (3 s at most), each NAME resolved; one line per outcome.
PROBE = """
import socket, sys, time
for target in sys.argv[1:]:
    started = time.monotonic()
    try:
        if ":" in target:
            host, port = target.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=3).close()
            print(f"allowed {target} in {time.monotonic() - started:.3f}s")
        else:
            print(f"resolved {target} to {socket.gethostbyname(target)}")
    except OSError as err:
        print(f"denied {target}: {type(err).__name__} after {time.monotonic() - started:.3f}s")
"""
# A job's worker that only listens on its TF_CONFIG port and accepts: a job to connect to, and a
# pod of another job to connect from, without a training's CPU.
LISTEN = """
import json, os, socket
conf = json.loads(os.environ["TF_CONFIG"])
task = conf["task"]
port = int(conf["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
server = socket.create_server(("", port))
print("listening on", port, flush=True)
while True:
    server.accept()[0].close()
"""
PROBES: list[str] = []
CONVERGE = 30


def listening_job(name: str) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": TF_IMAGE, "command": ["python", "-c", LISTEN],
                 "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name},
            "spec": {"tensorflow": {"worker": {"replicas": 1, "template": {"spec": {"containers": [container]}}}}}}


def bare_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "probe", "image": TF_IMAGE,
                                     "command": ["sleep", "3600"]}], "terminationGracePeriodSeconds": 0}}


def probe(cluster: Cluster, ns: str, pod: str, *targets: str) -> list[str]:
    return cluster.kubectl("exec", "-n", ns, pod, "--", "python", "-c", PROBE, *targets).stdout.splitlines()


def converged(cluster: Cluster, ns: str, pod: str, expected: list[str], *targets: str) -> list[str]:
    """The probe's lines once their outcomes are `expected`, which the firewall must reach within
    CONVERGE seconds of the pods running: kube-router adds a pod to its ipsets and chains in the
    full sync its IP triggers, on two busy cores. A policy not enforced never converges. The lines
    kept for the note are the converged ones, with the attempts it took."""
    attempts: list[list[str]] = []

    def matches() -> list[str] | None:
        attempts.append(probe(cluster, ns, pod, *targets))
        return attempts[-1] if [outcome(line) for line in attempts[-1]] == expected else None
    try:
        lines = wait_for(matches, CONVERGE, f"{pod} -> {targets}: {expected}", interval=1)
    except AssertionError:
        raise AssertionError(f"{pod}: {attempts[-3:]}, expected {expected}") from None
    PROBES.extend(f"{pod}: {line}" + (f" (attempt {len(attempts)})" if len(attempts) > 1 else "")
                  for line in lines)
    return lines


def address(cluster: Cluster, ns: str, pod: str, port: int = TF_PORT) -> str:
    return f"{cluster.core.read_namespaced_pod(pod, ns).status.pod_ip}:{port}"


def refused_at_once(lines: list[str]) -> bool:
    """kube-router REJECTs what a policy doesn't admit: the connection is refused, not left to time out."""
    return all(float(line.rsplit(" ", 1)[1].rstrip("s")) < 1 and "ConnectionRefusedError" in line
               for line in lines if outcome(line) == "denied")


def outcome(line: str) -> str:
    return line.split()[0]


@pytest.fixture(scope="module", autouse=True)
def keep_probes() -> Any:
    yield
    LAST_LINES.mkdir(parents=True, exist_ok=True)
    (LAST_LINES / "network-policy-probes.txt").write_text("".join(f"{line}\n" for line in PROBES))
    TIMED.append("e2e: network policy probes:\n    " + "\n    ".join(PROBES))


def test_a_jobs_policy_admits_its_peers_and_refuses_another_jobs_pods(cluster: Cluster, job_namespace: str,
                                                                       tmp_path: Path, follow: Follow) -> None:
    ns, started = job_namespace, time.monotonic()
    for name in ("intruder", "open"):
        cluster.apply(listening_job(name), ns)
    apply_example(cluster, ns, EXAMPLES / "multi-worker-mirrored" / "job.yaml", tmp_path,
                  env={"TRAIN_STEPS": "2000"},
                  edit_job=lambda job: job["spec"]["runPolicy"].update(networkPolicy={"egress": "PeersAndDNS"}))
    logs = follow(ns, wait_pods_running(cluster, ns, "mnist-mwms", 2, timeout=180))
    for name in ("intruder", "open"):
        wait_pods_running(cluster, ns, name, 1, timeout=120)
    # Training has begun: both workers' gRPC servers are up and have reached each other.
    logs["mnist-mwms-worker-0"].wait_event(lambda e: e.get("event") == "start", "training started")
    fenced, peer = address(cluster, ns, "mnist-mwms-worker-0"), address(cluster, ns, "mnist-mwms-worker-1")
    open_port = address(cluster, ns, "open-worker-0")

    converged(cluster, ns, "mnist-mwms-worker-1", ["allowed"], fenced)
    from_other_job = converged(cluster, ns, "intruder-worker-0", ["denied", "denied", "allowed"], fenced, peer,
                               open_port)
    assert refused_at_once(from_other_job), from_other_job
    # PeersAndDNS: names resolve (the cluster's DNS on the node, port 53); nothing else is reached.
    peer_name = f"mnist-mwms-worker-1.mnist-mwms.{ns}.svc.cluster.local"  # as TF_CONFIG names it
    converged(cluster, ns, "mnist-mwms-worker-0", ["resolved", "resolved", "allowed", "denied"],
              "kubernetes.default.svc.cluster.local", peer_name, peer, open_port)

    status = finish(cluster, ns, "mnist-mwms", started, logs, timing="mnist-mwms under NetworkPolicy PeersAndDNS")
    progress = status.get("progress") or {}
    assert progress.get("epoch") == progress.get("totalEpochs") is not None, \
        f"the reporter reached the operator through the job's egress rule: {progress}"


def test_the_progress_port_admits_a_jobs_pod_and_refuses_a_bare_pod(cluster: Cluster, job_namespace: str,
                                                                     chart_operator: str) -> None:
    """The chart's policy (templates/progress-networkpolicy.yaml): only pods labelled as a
    DistTrainJob's may connect to the progress port; the health port stays open to all."""
    ns = job_namespace
    operator = next(p for p in cluster.pods(chart_operator, "app.kubernetes.io/name=disttrain-operator")
                    if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))
    health = f"{operator.status.pod_ip}:{chart_health_port()}"
    cluster.apply(listening_job("reporter"), ns)
    cluster.core.create_namespaced_pod(ns, bare_pod("bare"))
    (pod,) = wait_pods_running(cluster, ns, "reporter", 1, timeout=120)
    wait_for(lambda: cluster.core.read_namespaced_pod("bare", ns).status.phase == "Running", 120, "the bare pod")
    endpoint = urlsplit(pod.metadata.annotations["disttrain.dev/progress-url"])
    progress = f"{endpoint.hostname}:{endpoint.port}"
    started = time.monotonic()
    converged(cluster, ns, "reporter-worker-0", ["allowed"], progress)
    assert refused_at_once(converged(cluster, ns, "bare", ["denied", "allowed"], progress, health))
    record_timing("e2e", "progress port probes converged (allowed, denied)", time.monotonic() - started)


def chart_health_port() -> int:
    values = yaml.safe_load((ROOT / "charts" / "disttrain-operator" / "values.yaml").read_text())
    return int(values["health"]["port"])
