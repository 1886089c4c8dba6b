"""A real local Kubernetes control plane for tests, the demo and the benchmarks.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from the Go module
proxy (hack/build-binaries.sh), plus KWOK simulating GPU nodes and the pods placed on them.
Everything listens on free loopback ports and lives in one state folder; `down` stops every
process it started and removes the folder.

    python hack/localcluster.py up   [--dir .cache/cluster] [--nodes 4]
    python hack/localcluster.py down [--dir .cache/cluster]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.x509.oid import ExtendedKeyUsageOID

import gangschedulers
import kueue
import realnode
from pki import issue, kubeconfig_text, subject, write_pki
from ports import free_port, http_ok

REPO = Path(__file__).resolve().parent.parent
BIN_DIR = Path(os.environ.get("DISTTRAIN_BIN_ROOT", REPO / ".cache" / "bin"))
DEFAULT_DIR = REPO / ".cache" / "cluster"
STAGES = REPO / "hack" / "kwok" / "stages.yaml"
SERVICE_CIDR = "10.96.0.0/16"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_PREFIX = "kwok-gpu-node-"
FAKE_NODE_VALUE = "fake"  # the annotation's value on the nodes the plane's KWOK manages
# Kubernetes' own gang scheduling, on in the API server and the scheduler (its plugin joins the
# default profile once the gate is on); the controller-manager needs GenericWorkload alone. 1.36:
# the GangScheduling gate and scheduling.k8s.io/v1alpha2; 1.37 removed both (an unknown gate or
# group/version stops a component at start-up): GenericWorkload alone, and v1beta1, off by default.
GANG_GATES = {36: "GenericWorkload=true,GangScheduling=true", 37: "GenericWorkload=true"}
GANG_API = {36: "scheduling.k8s.io/v1alpha2", 37: "scheduling.k8s.io/v1beta1"}
DEAD_LOG_LINES = 15  # of a component that died while the cluster started, in the error


class ComponentDied(RuntimeError):
    """One of the cluster's processes exited while it started (its name and log tail in the message)."""


def tf_configs_on_loopback(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The TF_CONFIGs of a job's pods with each `host:port` mapped to its own free loopback port,
    the same for every pod: KWOK runs no containers, so tests and the demo run the pods' real
    TensorFlow processes on this machine, and this is all the pod network they need."""
    addresses = sorted({a for c in configs.values() for hosts in c["cluster"].values() for a in hosts})
    loopback = {a: f"127.0.0.1:{free_port()}" for a in addresses}
    return {name: {**config, "cluster": {t: [loopback[a] for a in hosts] for t, hosts in config["cluster"].items()}}
            for name, config in configs.items()}


@functools.cache
def kube_version(bin_dir: Path = BIN_DIR) -> str:
    """The version of the plane's binaries (BIN_DIR: the default build, or a version's own folder
    from hack/build-kube-version.sh), as "v1.37.2"."""
    out = subprocess.run([str(bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True,
                         check=True).stdout  # "Kubernetes v1.37.2"
    return out.split()[-1]


def kube_minor(bin_dir: Path = BIN_DIR) -> int:
    return int(kube_version(bin_dir).split(".")[1])


def gang_gates(bin_dir: Path = BIN_DIR) -> str:
    return GANG_GATES[min(max(kube_minor(bin_dir), min(GANG_GATES)), max(GANG_GATES))]


def gang_api(bin_dir: Path = BIN_DIR) -> str:
    return GANG_API[min(max(kube_minor(bin_dir), min(GANG_API)), max(GANG_API))]


# ---------------------------------------------------------------------------------------------


@dataclass
class LocalCluster:
    """A control plane whose state (pids, ports, certs, logs, etcd data) lives in `root`."""

    root: Path = DEFAULT_DIR
    nodes: int = 4
    gpus_per_node: int = 8
    real_node: bool = False  # a kubelet with containerd on this machine too (hack/realnode.py)
    # scheduler-plugins' and Volcano's schedulers beside the default one (hack/gangschedulers.py)
    gang_schedulers: bool = True
    kueue: bool = True  # Kueue's controller (hack/kueue.py; needs root: it runs in a mount namespace)
    # The API server's audit log (<root>/audit.log, one JSON event per request at Metadata level)
    # for these users only: what one client did, told apart from every component sharing admin.
    audit_users: tuple[str, ...] = ()
    # ... and of every user in one of these groups (system:serviceaccounts: every pod's and token's).
    audit_groups: tuple[str, ...] = ()
    service_cidr: str = SERVICE_CIDR
    # Where its binaries are: the default build, or a version's folder (hack/build-kube-version.sh).
    bin_dir: Path = BIN_DIR
    processes: dict[str, int] = field(default_factory=dict)
    # The children this object started, kept so they are reaped (and Python doesn't warn).
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    argv: dict[str, list[str]] = field(default_factory=dict, repr=False)
    server: str = ""
    nodes_ready: int = 0

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """Where the API server listens: loopback, or the real node's bridge (its pods reach it there)."""
        return realnode.GATEWAY if self.real_node else "127.0.0.1"

    def up(self, timeout: float = 60) -> LocalCluster:
        wanted = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
        wanted += list(realnode.DAEMONS) if self.real_node else []
        wanted += ["coscheduler", "coscheduling-controller", "vc-scheduler"] if self.gang_schedulers else []
        wanted += ["kueue"] if self.kueue else []
        missing = [b for b in wanted if not (self.bin_dir / b).exists()]
        if missing:
            raise RuntimeError(f"missing {missing} in {self.bin_dir}: run hack/build-binaries.sh (make binaries)")
        if self.state_file.exists():
            self.down()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        deadline = time.monotonic() + timeout + (120 if self.real_node else 0)
        pki = self.root / "pki"
        try:
            if self.real_node:
                realnode.RealNode(self).down()  # whatever an earlier run left behind
                realnode.create_bridge()
            write_pki(pki, [self.host, "127.0.0.1", str(next(ipaddress.ip_network(self.service_cidr).hosts()))])
            self._start_etcd(deadline)
            self._start_apiserver(pki, deadline)
            self.kubeconfig.write_text(kubeconfig_text(self.server, pki))
            self.kubeconfig.chmod(0o600)
            self._start_controllers(pki)
            self._start_kwok()
            self._create_nodes()
            if self.gang_schedulers:
                gangschedulers.start(self, self.bin_dir, deadline)
            if self.kueue:
                kueue.start(self, self.bin_dir, deadline)
            if self.real_node:
                realnode.RealNode(self).up(deadline)
            self._wait_ready(deadline)
            self.check_alive()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop everything. With a real node: raise if it left anything behind (a process, mount,
        network namespace, veth, the bridge, an iptables chain) after the rest is stopped."""
        state = self._read_state()
        pids = state.get("processes", {}) | self.processes
        real_node = bool(state.get("real_node") or self.real_node)
        if real_node:
            self._stop_real_node(pids)
        # Stop the clients first and etcd last, so nothing logs a storm of connection errors.
        _stop(*(pid for name, pid in pids.items() if name != "etcd"))
        if "etcd" in pids:
            _stop(pids["etcd"])
        for child in self.children.values():
            child.wait()
        self.processes, self.children = {}, {}
        shutil.rmtree(state.get("etcd_dir") or "/nonexistent", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        left = realnode.leftovers(self.root / "node") if real_node else []
        if left:
            raise RuntimeError(f"the real node left behind: {left}")

    def _stop_real_node(self, pids: dict[str, int]) -> None:
        """The node's pods deleted while its kubelet still runs (CNI releases their networks), then
        the node's daemons, containerd last, then whatever is left."""
        node = realnode.RealNode(self)
        if "kube-apiserver" in pids and "kubelet" in pids:
            node.drain()
        _stop(*(pids.pop(name) for name in realnode.DAEMONS if name in pids))
        realnode.remove_containers()
        if "containerd" in pids:
            _stop(pids.pop("containerd"))
        node.down()

    def __enter__(self) -> LocalCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- components --------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], append: bool = False) -> None:
        self.spawn(name, [str(self.bin_dir / name), *args], append)

    def spawn(self, name: str, argv: list[str], append: bool = False) -> None:
        """Start one of the cluster's processes, logging to logs/<name>.log; `down` stops it."""
        with open(self.root / "logs" / f"{name}.log", "ab" if append else "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.processes[name] = proc.pid
        self.children[name] = proc
        self.argv[name] = argv
        self._write_state()

    def restart(self, name: str) -> None:
        """Stop one of the cluster's processes (SIGTERM) and start it again as it was: an API
        server restarted under its clients (tests/chaos)."""
        _stop(self.processes[name])
        self.children[name].wait()
        self.spawn(name, self.argv[name], append=True)

    def pause(self, name: str, seconds: float) -> None:
        """Freeze one of the cluster's processes (SIGSTOP) for `seconds`: an etcd that stops answering."""
        os.kill(self.processes[name], signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(self.processes[name], signal.SIGCONT)

    def _start_etcd(self, deadline: float) -> None:
        # etcd's data is thrown away with the cluster: keep it in memory where we can.
        shm = Path("/dev/shm")
        self.etcd_dir = Path(tempfile.mkdtemp(prefix="disttrain-etcd-", dir=shm if shm.is_dir() else None))
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            "--name=local", f"--data-dir={self.etcd_dir}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=local=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--quota-backend-bytes=8589934592", "--log-level=warn",
        ])
        self.wait("etcd healthy", lambda: http_ok(f"{self.etcd_url}/health"), deadline)

    def upgrade(self, bin_dir: Path, timeout: float = 60) -> None:
        """The control plane replaced by `bin_dir`'s, in Kubernetes' upgrade order: the API server
        (on the same port and etcd), then the controller manager and the scheduler, each stopped and
        started with the flags its minor wants. Nodes and every other client keep running."""
        deadline = time.monotonic() + timeout
        pki = self.root / "pki"
        self.bin_dir = bin_dir
        self._replace("kube-apiserver")
        self._start_apiserver(pki, deadline, port=int(self.server.rsplit(":", 1)[1]), append=True)
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._replace(name)
        self._start_controllers(pki, append=True)
        time.sleep(2)  # a flag or controller the new minor refuses ends it within a moment
        self.check_alive()

    def _replace(self, name: str) -> None:
        _stop(self.processes.pop(name))
        self.children.pop(name).wait()

    def _start_apiserver(self, pki: Path, deadline: float, port: int | None = None, append: bool = False) -> None:
        port = port or free_port()
        self.server = f"https://{self.host}:{port}"
        self._spawn("kube-apiserver", [
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.host}", f"--advertise-address={self.host}", f"--secure-port={port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={self.service_cidr}",
            # Node: the real node's kubelet may touch its own Node and pods, nothing else.
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            # A namespace's annotations may pin its pods to nodes (a node selector and default
            # tolerations): how the real node's tests run the examples unchanged.
            "--enable-admission-plugins=PodNodeSelector,PodTolerationRestriction",
            # Kubernetes' own gang scheduling (KEP-4671, alpha): the Workload and PodGroup API and
            # the pods' spec.schedulingGroup.
            f"--feature-gates={gang_gates(self.bin_dir)}", f"--runtime-config={gang_api(self.bin_dir)}=true",
            "--profiling=false",
            # The `kubernetes` Service's endpoint: pods on the real node reach the API server
            # through it (kube-proxy); a loopback address can't be an endpoint.
            f"--endpoint-reconciler-type={'lease' if self.real_node else 'none'}",
            # `kubectl logs` and `exec`: to the kubelet by address, with the admin's cert.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki / 'admin.crt'}", f"--kubelet-client-key={pki / 'admin.key'}",
            *self._audit_flags(),
            "--v=1",
        ], append)
        ctx = self._ssl_context(pki)
        self.wait("kube-apiserver ready", lambda: http_ok(f"{self.server}/readyz", ctx), deadline)

    def _audit_flags(self) -> list[str]:
        if not self.audit_users and not self.audit_groups:
            return []
        # One rule each: a rule naming both users and groups needs a request to match both.
        rules = ([{"level": "Metadata", "users": list(self.audit_users)}] if self.audit_users else []) + (
            [{"level": "Metadata", "userGroups": list(self.audit_groups)}] if self.audit_groups else [])
        policy = self.root / "audit-policy.yaml"
        policy.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [*rules, {"level": "None"}]}))
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.root / 'audit.log'}",
                "--audit-log-maxsize=0", "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s"]

    def user_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig for a client cert of its own (`groups`: system:masters for all rights), so
        the audit log tells this client's requests from the admin's."""
        pki = self.root / "pki"
        issue(pki, user, subject(user, *groups[:1]), usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
        path = self.root / f"{user}.kubeconfig"
        path.write_text(kubeconfig_text(self.server, pki, user))
        path.chmod(0o600)
        return path

    def _start_controllers(self, pki: Path, append: bool = False) -> None:
        kc = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kc}", "--leader-elect=false", "--secure-port=0",
            # The controllers an operator's objects meet: garbage collection, namespaces,
            # service accounts and their tokens, endpoints for the headless Services.
            # root-ca-cert-publisher: the kube-root-ca.crt every pod's token volume mounts;
            # persistentvolume-binder: volumes for the real node's pods; deployment and
            # replicaset: the chart's operator Deployment.
            "--controllers=garbagecollector,namespace,serviceaccount,serviceaccount-token,"
            "endpointslice,endpoint,podgc,ttl,nodelifecycle,resourcequota,root-ca-cert-publisher,"
            "persistentvolume-binder,deployment,replicaset,podgroup-protection-controller,"
            # taint-eviction-controller: the pods of a node marked unreachable are evicted once their
            # toleration runs out (300 s, the API server's default; tests/chaos/test_node_lost.py
            # gives its own pods 5 s).
            "taint-eviction-controller,resourceclaim-controller",
            # resourceclaim-controller: a pod's claim made from its ResourceClaimTemplate (DRA).
            # podgroup-protection-controller lifts the finalizer every PodGroup gets once none
            # of its pods runs: without it a PodGroup is never deleted.
            "--feature-gates=GenericWorkload=true",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            "--kube-api-qps=1000", "--kube-api-burst=2000", "--concurrent-gc-syncs=50",
            "--v=1",
        ], append)
        scheduler_config = self.root / "scheduler.yaml"
        scheduler_config.write_text(json.dumps({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": kc, "qps": 1000, "burst": 2000},
            "leaderElection": {"leaderElect": False},
        }))
        self._spawn("kube-scheduler", [f"--config={scheduler_config}", "--secure-port=0",
                                       f"--feature-gates={gang_gates(self.bin_dir)}", "--v=1"], append)

    def _start_kwok(self) -> None:
        # The fake nodes' pod deletes: ours, with the pod's UID as precondition (hack/podreaper.py).
        kubelet = [f"--kubelet-node={realnode.NODE_NAME}"] if self.real_node else []
        self.spawn("podreaper", [sys.executable, str(REPO / "hack" / "podreaper.py"), f"--server={self.server}",
                                 f"--pki={self.root / 'pki'}", *kubelet])
        self.spawn("kwok", self.kwok_argv(FAKE_NODE_VALUE))

    def kwok_argv(self, node_value: str) -> list[str]:
        """KWOK managing the nodes annotated `kwok.x-k8s.io/node: <node_value>` (the plane's own are
        "fake"; a test may run another KWOK for nodes of its own)."""
        return [
            str(self.bin_dir / "kwok"),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}={node_value}",
            f"--server-address=127.0.0.1:{free_port()}",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.0.0.1",
        ]

    def _create_nodes(self) -> None:
        for i in range(self.nodes):
            self.create_node(i)

    def create_node(self, i: int, prefix: str = FAKE_NODE_PREFIX, node_value: str = FAKE_NODE_VALUE) -> None:
        """Fake node `i` (KWOK keeps it Ready): at start, and again after a test deleted it."""
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "1000", "nvidia.com/gpu": str(self.gpus_per_node)}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"{prefix}{i}",
                "annotations": {FAKE_NODE_ANNOTATION: node_value, "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": f"{prefix}{i}", "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok",
                           "nvidia.com/gpu.present": "true"},
            },
            "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        self.api("POST", "/api/v1/nodes", node)

    def silence_node(self, i: int, silent: bool = True) -> None:
        """Fake node `i` no longer KWOK's (no heartbeat: after its grace period the node lifecycle
        controller marks it unreachable and taints it), or KWOK's again (Ready again)."""
        self.api("PATCH", f"/api/v1/nodes/{FAKE_NODE_PREFIX}{i}",
                 {"metadata": {"annotations": {FAKE_NODE_ANNOTATION: "silent" if silent else FAKE_NODE_VALUE}}},
                 content_type="application/merge-patch+json")

    def check_alive(self) -> None:
        """Raise, naming each of the cluster's processes that has exited and the end of its log (a
        component that crashed at start-up is reported at once, not after the wait's timeout)."""
        dead = {name: child.returncode for name, child in self.children.items() if child.poll() is not None}
        if dead:
            tails = "\n".join(f"--- {name} (exit {code}), last lines of {self.root / 'logs' / name}.log:\n" +
                              "\n".join(self.log_tail(name, DEAD_LOG_LINES)) for name, code in dead.items())
            raise ComponentDied(f"{', '.join(dead)} exited while the cluster started:\n{tails}")

    def log_tail(self, name: str, lines: int) -> list[str]:
        path = self.root / "logs" / f"{name}.log"
        return path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []

    def wait(self, what: str, ready: Callable[[], object], deadline: float, interval: float = 0.2) -> None:
        """Poll `ready` until it is truthy; every component still alive at each poll, or
        ComponentDied; TimeoutError naming `what` at the deadline."""
        while True:
            self.check_alive()
            if ready():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not by the deadline; logs in {self.root / 'logs'}")
            time.sleep(interval)

    def _wait_ready(self, deadline: float) -> None:
        """Nodes Ready and the default ServiceAccount present: pods can be created and scheduled."""
        want = self.nodes + int(self.real_node)

        def ready() -> bool:
            nodes = self.api("GET", "/api/v1/nodes")["items"]
            self.nodes_ready = sum(any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in n.get("status", {}).get("conditions", [])) for n in nodes)
            sa = self.api("GET", "/api/v1/namespaces/default/serviceaccounts", allow_missing=True)
            return self.nodes_ready >= want and bool(sa and sa.get("items"))

        try:
            self.wait("cluster ready", ready, deadline)
        except TimeoutError as err:
            raise TimeoutError(f"cluster not ready: {self.nodes_ready}/{want} nodes Ready ({err})") from None

    # -- helpers -----------------------------------------------------------------------------

    def _ssl_context(self, pki: Path | None = None) -> ssl.SSLContext:
        pki = pki or self.root / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def api_text(self, path: str) -> str:
        """A GET of a plain-text endpoint (/metrics) as the admin."""
        with urllib.request.urlopen(self.server + path, context=self._ssl_context(), timeout=30) as resp:
            return str(resp.read().decode())

    def api(self, method: str, path: str, body: Any = None, *, allow_missing: bool = False,
            content_type: str = "application/json") -> Any:
        """A bare admin request to the apiserver; enough for setting up the cluster itself."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=self._ssl_context(), timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            with err:  # an error response holds its connection until closed
                if allow_missing and err.code == 404:
                    return None
                raise RuntimeError(f"{method} {path}: {err.code} {err.read().decode(errors='replace')}") from err

    def _write_state(self) -> None:
        self.state_file.write_text(json.dumps({
            "processes": self.processes, "server": self.server, "real_node": self.real_node,
            "etcd_dir": str(getattr(self, "etcd_dir", "")),
        }))

    def _read_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        except (FileNotFoundError, json.JSONDecodeError):
            return {}


def _stop(*pids: int, grace: float = 5) -> None:
    """SIGTERM to each process group, then wait for all of them together (SIGKILL after `grace`)."""
    alive = set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            alive.add(pid)
    end = time.monotonic() + grace
    while alive and time.monotonic() < end:
        for pid in list(alive):
            if _gone(pid):
                alive.discard(pid)
        time.sleep(0.05)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _gone(pid: int) -> bool:
    """Reaped if it is our child; otherwise gone or a zombie (a zombie has exited: init reaps it)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state folder (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (default %(default)s)")
    parser.add_argument("--no-gang-schedulers", action="store_true",
                        help="without scheduler-plugins' and Volcano's schedulers beside the default one")
    parser.add_argument("--no-kueue", action="store_true", help="without Kueue")
    parser.add_argument("--real-node", action="store_true",
                        help="also a real node: containerd, kubelet, CoreDNS, kube-proxy (needs root, make node)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(root=args.dir.resolve(), nodes=args.nodes, real_node=args.real_node,
                           gang_schedulers=not args.no_gang_schedulers, kueue=not args.no_kueue)
    if args.command == "down":
        cluster.down()
        print("local control plane stopped")
        return 0
    start = time.monotonic()
    cluster.up()
    print(f"local control plane up in {time.monotonic() - start:.1f}s at {cluster.server} "
          f"({args.nodes} KWOK nodes with {cluster.gpus_per_node} nvidia.com/gpu each)")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
