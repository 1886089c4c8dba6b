"""What the end-to-end tests on the real node share (tests/e2e): namespaces pinned to the node,
the examples applied as a user would, their pods' logs followed, a job waited for to its end."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from support import ROOT, Cluster, LogFollower, record_timing, wait_for, wait_namespace_ready

HELM = ROOT / ".cache" / "bin" / "helm"
EXAMPLES = ROOT / "examples"
LAST_LINES = ROOT / ".cache" / "e2e-last-lines"
Follow = Callable[[str, list[Any]], dict[str, LogFollower]]


def pinned_namespace(cluster: Cluster, name: str) -> str:
    """A namespace whose pods land on the real node and pull from the plane's registry: its pull
    secret, named by the default ServiceAccount (so by every pod that names none)."""
    import realnode
    import registry

    cluster.core.create_namespace(realnode.pinned_namespace(name))
    cluster.apply(registry.Registry(cluster.kubeconfig.parent).namespace_pulls(name))
    wait_namespace_ready(cluster, name)
    return name


def apply_example(cluster: Cluster, ns: str, path: Path, tmp_path: Path,
                  env: dict[str, str] | None = None,
                  edit: Callable[[dict[str, Any]], None] | None = None,
                  edit_job: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """`kubectl apply -f` the example; each PersistentVolumeClaim in it gets a hostPath volume on
    the node. `env` overrides variables of the example's containers (the fault run's length);
    `edit` changes each of them (a GPU example run on this CPU node); `edit_job` the job. Its
    images are pulled from the plane's registry, as a user names their registry's."""
    import realnode
    import registry

    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for claim in (d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"):
        cluster.core.create_persistent_volume(realnode.claim_volume(ns, claim, tmp_path / claim))
    if env:
        for replica in yaml_replicas(docs):
            for container in replica["template"]["spec"]["containers"]:
                container["env"] = [e for e in container.get("env", []) if e["name"] not in env] + [
                    {"name": k, "value": v} for k, v in env.items()]
    if edit:
        for replica in yaml_replicas(docs):
            for each in replica["template"]["spec"]["containers"]:
                edit(each)
    if edit_job:
        edit_job(next(d for d in docs if d["kind"] == "DistTrainJob"))
    docs = [registry.from_local_registry(d) for d in docs]
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))
    return next(d for d in docs if d["kind"] == "DistTrainJob")


def yaml_replicas(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    job = next(d for d in docs if d["kind"] == "DistTrainJob")["spec"]
    framework = job.get("tensorflow") or job["mpi"]
    return [r for r in framework.values() if isinstance(r, dict) and "template" in r]


def running_with(cluster: Cluster, ns: str, job: str, needed: set[str], timeout: float = 180) -> list[Any]:
    """The job's pods Running now, once every pod in `needed` is one of them: for a job whose
    deciding pod needs no other to be up (TF1's worker 0 trains through the ps alone; the ps
    example's chief doesn't wait for the evaluator). Such a job may succeed before a peer the
    kubelet started late ever runs (seen: a volume mount retried after 10 s), and that is no
    failure of the job."""
    def running() -> list[Any] | None:
        pods = [p for p in cluster.pods(ns, f"disttrain.dev/job-name={job}")
                if not p.metadata.deletion_timestamp and p.status.phase == "Running"]
        return pods if needed <= {p.metadata.name for p in pods} else None
    return wait_for(running, timeout, f"{sorted(needed)} of {job} running", interval=0.5)


def finish(cluster: Cluster, ns: str, job: str, started: float, logs: dict[str, LogFollower],
           timeout: float = 600, timing: str | None = None) -> dict[str, Any]:
    """`timing`: the name the run's time is kept under (default: the job's)."""
    status = wait_for(lambda: (s := cluster.job_status(ns, job)).get("phase") in ("Succeeded", "Failed") and s,
                      timeout, f"{job} to finish", interval=1)
    record_timing("e2e", timing or job, time.monotonic() - started)
    tails = "\n".join(f"--- {name}\n" + "\n".join(f.lines[-30:]) for name, f in logs.items())
    assert status["phase"] == "Succeeded", f"{status.get('message')}\n{tails}"
    return status


@contextlib.contextmanager
def node_blocks_ssh() -> Iterator[None]:
    """The node's connections to its pods' port 22 dropped while in the block: the kubelet's SSH
    startup probe fails, as for an sshd not listening yet (pod-to-pod traffic, mpirun's, is not the
    node's and passes). In the raw table, not filter: kube-router keeps its jump first in filter's
    OUTPUT and accepts the node's traffic to its pods there (issue 32), so a REJECT inserted at the
    head of filter's OUTPUT is moved behind it by the firewall's next sync. The raw table is no
    one's else here, and comes first; it can't REJECT, so a probe times out (its 1 s) instead of
    being refused."""
    import realnode

    rule = ["OUTPUT", "-d", realnode.SUBNET, "-p", "tcp", "--dport", "22", "-j", "DROP"]
    subprocess.run(["iptables", "-w", "-t", "raw", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-w", "-t", "raw", "-D", *rule], check=True)
