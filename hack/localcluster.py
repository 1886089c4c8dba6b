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
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parent.parent
BIN_DIR = Path(os.environ.get("DISTTRAIN_BIN_ROOT", REPO / ".cache" / "bin"))
DEFAULT_DIR = REPO / ".cache" / "cluster"
STAGES = REPO / "hack" / "kwok" / "stages.yaml"
SERVICE_CIDR = "10.96.0.0/16"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tf_configs_on_loopback(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The TF_CONFIGs of a job's pods with each `host:port` mapped to its own free loopback port,
    the same for every pod: KWOK runs no containers, so tests and the demo run the pods' real
    TensorFlow processes on this machine, and this is all the pod network they need."""
    addresses = sorted({a for c in configs.values() for hosts in c["cluster"].values() for a in hosts})
    loopback = {a: f"127.0.0.1:{free_port()}" for a in addresses}
    return {name: {**config, "cluster": {t: [loopback[a] for a in hosts] for t, hosts in config["cluster"].items()}}
            for name, config in configs.items()}


# ---------------------------------------------------------------------------------------------
# PKI: one CA signs the apiserver's serving cert and the admin client cert; EC keys are fast
# to make, so every cluster gets fresh ones.


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    usage: list[x509.ObjectIdentifier] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(pki: Path) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "disttrain-local-ca")])
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    server_key = _key()
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
           "kubernetes.default.svc.cluster.local"]
    ips = ["127.0.0.1", str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))]
    server = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]), server_key, ca_name, ca_key,
        sans=[x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips],
        usage=[x509.oid.ExtendedKeyUsageOID.SERVER_AUTH],
    )
    admin_key = _key()
    admin = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin"),
                   x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")]),
        admin_key, ca_name, ca_key, usage=[x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    sa_key = _key()
    files = {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "ca.key": _pem_key(ca_key),
        "apiserver.crt": server.public_bytes(serialization.Encoding.PEM),
        "apiserver.key": _pem_key(server_key),
        "admin.crt": admin.public_bytes(serialization.Encoding.PEM),
        "admin.key": _pem_key(admin_key),
        "sa.key": _pem_key(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    for name, data in files.items():
        (pki / name).write_bytes(data)
        (pki / name).chmod(0o600)


def kubeconfig_text(server: str, pki: Path) -> str:
    import base64

    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "disttrain-local",
                      "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "admin",
                   "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": "disttrain-local", "context": {"cluster": "disttrain-local", "user": "admin"}}],
        "current-context": "disttrain-local",
    }
    return json.dumps(config, indent=2)


# ---------------------------------------------------------------------------------------------


@dataclass
class LocalCluster:
    """A control plane whose state (pids, ports, certs, logs, etcd data) lives in `root`."""

    root: Path = DEFAULT_DIR
    nodes: int = 4
    gpus_per_node: int = 8
    processes: dict[str, int] = field(default_factory=dict)
    # The children this object started, kept so they are reaped (and Python doesn't warn).
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    server: str = ""

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    # -- lifecycle ---------------------------------------------------------------------------

    def up(self, timeout: float = 60) -> LocalCluster:
        missing = [b for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
                   if not (BIN_DIR / b).exists()]
        if missing:
            raise RuntimeError(f"missing {missing} in {BIN_DIR}: run hack/build-binaries.sh (make binaries)")
        if self.state_file.exists():
            self.down()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        deadline = time.monotonic() + timeout
        pki = self.root / "pki"
        write_pki(pki)
        try:
            self._start_etcd(deadline)
            self._start_apiserver(pki, deadline)
            self.kubeconfig.write_text(kubeconfig_text(self.server, pki))
            self.kubeconfig.chmod(0o600)
            self._start_controllers(pki)
            self._start_kwok()
            self._create_nodes()
            self._wait_ready(deadline)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        state = self._read_state()
        pids = state.get("processes", {}) | self.processes
        # Stop the clients first and etcd last, so nothing logs a storm of connection errors.
        for name in sorted(pids, key=lambda n: n == "etcd"):
            _stop(pids[name])
        for child in self.children.values():
            child.wait()
        self.processes, self.children = {}, {}
        shutil.rmtree(state.get("etcd_dir") or "/nonexistent", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()

    def __enter__(self) -> LocalCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- components --------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / "logs" / f"{name}.log", "wb")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [str(BIN_DIR / name), *args], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        self.processes[name] = proc.pid
        self.children[name] = proc
        self._write_state()

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
        _wait_http(f"{self.etcd_url}/health", deadline, "etcd")

    def _start_apiserver(self, pki: Path, deadline: float) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self._spawn("kube-apiserver", [
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
            "--v=1",
        ])
        ctx = self._ssl_context(pki)
        _wait_http(f"{self.server}/readyz", deadline, "kube-apiserver", ctx)

    def _start_controllers(self, pki: Path) -> None:
        kc = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kc}", "--leader-elect=false", "--secure-port=0",
            # The controllers an operator's objects meet: garbage collection, namespaces,
            # service accounts and their tokens, endpoints for the headless Services.
            "--controllers=garbagecollector,namespace,serviceaccount,serviceaccount-token,"
            "endpointslice,endpoint,podgc,ttl,nodelifecycle,resourcequota",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            "--kube-api-qps=1000", "--kube-api-burst=2000", "--concurrent-gc-syncs=50",
            "--v=1",
        ])
        scheduler_config = self.root / "scheduler.yaml"
        scheduler_config.write_text(json.dumps({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": kc, "qps": 1000, "burst": 2000},
            "leaderElection": {"leaderElect": False},
        }))
        self._spawn("kube-scheduler", [f"--config={scheduler_config}", "--secure-port=0", "--v=1"])

    def _start_kwok(self) -> None:
        self._spawn("kwok", [
            f"--kubeconfig={self.kubeconfig}",
            f"--config={STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{free_port()}",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.0.0.1",
        ])

    def _create_nodes(self) -> None:
        for i in range(self.nodes):
            capacity = {"cpu": "32", "memory": "256Gi", "pods": "1000", "nvidia.com/gpu": str(self.gpus_per_node)}
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"kwok-gpu-node-{i}",
                    "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"kubernetes.io/hostname": f"kwok-gpu-node-{i}", "kubernetes.io/os": "linux",
                               "kubernetes.io/arch": "amd64", "type": "kwok",
                               "nvidia.com/gpu.present": "true"},
                },
                "spec": {},
                "status": {"capacity": capacity, "allocatable": capacity},
            }
            self.api("POST", "/api/v1/nodes", node)

    def _wait_ready(self, deadline: float) -> None:
        """Nodes Ready and the default ServiceAccount present: pods can be created and scheduled."""
        while True:
            nodes = self.api("GET", "/api/v1/nodes")["items"]
            ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                             for c in n.get("status", {}).get("conditions", []))]
            sa = self.api("GET", "/api/v1/namespaces/default/serviceaccounts", allow_missing=True)
            if len(ready) >= self.nodes and sa and sa.get("items"):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ready: {len(ready)}/{self.nodes} nodes Ready; "
                                   f"logs in {self.root / 'logs'}")
            time.sleep(0.2)

    # -- helpers -----------------------------------------------------------------------------

    def _ssl_context(self, pki: Path | None = None) -> ssl.SSLContext:
        pki = pki or self.root / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

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
            "processes": self.processes, "server": self.server,
            "etcd_dir": str(getattr(self, "etcd_dir", "")),
        }))

    def _read_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        except (FileNotFoundError, json.JSONDecodeError):
            return {}


def _stop(pid: int, grace: float = 5) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end:
        try:
            # Reap it if it is our child; otherwise just probe that it still exists.
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _wait_http(url: str, deadline: float, what: str, ctx: ssl.SSLContext | None = None) -> None:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as err:  # up, not ready yet (503); close its connection
            err.close()
            last = err
        except (urllib.error.URLError, ConnectionError, OSError) as err:
            last = err
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not become healthy at {url}: {last}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state folder (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (default %(default)s)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(root=args.dir.resolve(), nodes=args.nodes)
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
