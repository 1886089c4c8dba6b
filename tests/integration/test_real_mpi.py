"""Real `mpirun` (Open MPI 4.1) works with what the operator generates for an MPI job.

No Kubernetes: the job's real objects come from the pure builders (supporting_objects, job_pod)
and every pod becomes a Linux network namespace with its own UTS hostname and mount namespace.
Each node's volumes are the generated ConfigMap/Secret projected into files (keys, items and
modes as the pod spec says) and mounted at the pod's mountPaths (/etc/mpi, /root/.ssh), over an
overlay of the parent directory so nothing on the host changes (but for sshd's empty
privilege-separation directory /run/sshd, created if missing). Workers run the generated
command (`sshd -De`) with a test-only sshd config; the launcher runs mpirun with the generated
pod's environment and nothing else, so Open MPI must find the hostfile, reach the workers by
their FQDNs and log in with the Secret's key and ssh config by itself.

The namespaces hang off a bridge inside a switch namespace of their own: no interface in the
host's network namespace, nothing routes to the private subnet from outside. Everything is
torn down (processes in the namespaces killed, namespaces deleted) even when a test fails.

Needs root, `ip netns`, overlayfs, Debian's openmpi-bin and openssh-server
(hack/mpi-e2e/setup-system.sh) and the cached venv .cache/hvd-venv with mpi4py, TensorFlow 2.15
and Horovod 0.28.1 (hack/mpi-e2e/build-hvd-venv.sh).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import parse_spec
from disttrain.builders import mpi
from disttrain.builders.desired import job_pod, supporting_objects
from disttrain.builders.naming import pod_fqdn, pod_name
from disttrain.control.ssh_keys import generate_ssh_keys

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parents[2]
HVD_PYTHON = ROOT / ".cache" / "hvd-venv" / "bin" / "python"
RANK_SCRIPTS = ROOT / "tests" / "mpi"
JOB, NAMESPACE, WORKERS = "hvd", "mpitest", 2
# Private to each run: the subnet lives only on the bridge in this run's own switch namespace.
SUBNET = "10.250.0"
LAUNCHER_IP = f"{SUBNET}.10"
NETNS_PREFIX = "dtmpi-"  # then <pytest pid>-<random>-<node>
# A container's environment starts from its image's; these stand for an image's defaults.
IMAGE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
             "LANG": "C.UTF-8"}
# Open MPI refuses to run as root unless told; a real image sets these (or runs as a user).
RUN_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# Passed to the ranks with -x: keep two TensorFlow ranks from fighting over two cores.
RANK_ENV = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
# What the worker image's sshd_config must hold. StrictModes no is required, not a shortcut: the
# kubelet's Secret volume directory is world-writable (1777, as project_volume makes it), and with
# the default StrictModes yes sshd refuses the key ("bad ownership or modes for directory /root/.ssh").
SSHD_CONFIG = """\
ListenAddress {ip}
Port 22
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile .ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# Stock sshd's default: the operator's worker command must override it (the Secret volume's
# directory is world-writable, which StrictModes rejects).
StrictModes yes
"""


def run(argv: list[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr or proc.stdout}")
    return proc


def require_host() -> None:
    """The test needs root and `ip netns`; anything missing is a failure, not a skip."""
    if os.geteuid() != 0:
        pytest.fail("test_real_mpi needs root (network namespaces, mounts); run it as root")
    missing = [tool for tool in ("ip", "unshare", "mount", "hostname", "mpirun", "orted", "ssh", "ssh-keygen")
               if shutil.which(tool) is None]
    if not Path("/usr/sbin/sshd").exists():
        missing.append("/usr/sbin/sshd")
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run hack/mpi-e2e/setup-system.sh")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"`ip netns` is unavailable here: {probe.stderr.strip()}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        pytest.fail("overlayfs is unavailable (needed to mount the pods' volumes without touching the host)")
    if not HVD_PYTHON.exists():
        pytest.fail(f"{HVD_PYTHON} is missing: run hack/mpi-e2e/build-hvd-venv.sh")


@dataclass
class GeneratedJob:
    """The operator's own output for the test job."""

    ref: JobRef
    objects: dict[str, dict[str, Any]]  # by kind: Service, ConfigMap, Secret
    pods: dict[str, dict[str, Any]]  # by pod name


def generate_job() -> GeneratedJob:
    container = {"name": "main", "image": "example.com/horovod:test"}
    launcher = {**container, "command": ["mpirun", "python", "train.py"]}
    spec = parse_spec({"mpi": {
        "launcher": {"template": {"spec": {"containers": [launcher]}}},
        "worker": {"replicas": WORKERS, "template": {"spec": {"containers": [container]}}},
    }})
    ref = JobRef(JOB, NAMESPACE, "0000-test")
    objects = {o["kind"]: o for o in supporting_objects(ref, spec, generate_ssh_keys(f"{JOB}-test"),
                                                        range(WORKERS))}
    keys = [PodKey("launcher", 0)] + [PodKey("worker", i) for i in range(WORKERS)]
    pods = {pod["metadata"]["name"]: pod for pod in (job_pod(ref, spec, key) for key in keys)}
    return GeneratedJob(ref, objects, pods)


def project_volume(volume: Mapping[str, Any], objects: Mapping[str, Mapping[str, Any]], target: Path) -> None:
    """What the kubelet writes for a ConfigMap or Secret volume: a world-writable sticky directory
    holding each key (or each listed item) as a symlink into `..data/`, the file with the item's
    mode or the volume's defaultMode (0644 when unset)."""
    if "secret" in volume:
        source, obj = volume["secret"], objects["Secret"]
        assert source["secretName"] == obj["metadata"]["name"], "the pod mounts a Secret the job does not own"
        data = obj["stringData"]
    elif "configMap" in volume:
        source, obj = volume["configMap"], objects["ConfigMap"]
        assert source["name"] == obj["metadata"]["name"], "the pod mounts a ConfigMap the job does not own"
        data = obj["data"]
    else:
        raise AssertionError(f"unexpected volume {volume}")
    default_mode = source.get("defaultMode", 0o644)
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    version = target / "..2025_01_01_00_00_00.000000000"
    version.mkdir(parents=True)
    target.chmod(0o1777)
    (target / "..data").symlink_to(version.name)
    for item in items:
        assert "/" not in item["path"], item
        path = version / item["path"]
        path.write_text(data[item["key"]])
        path.chmod(item.get("mode", default_mode))
        (target / item["path"]).symlink_to(f"..data/{item['path']}")


@dataclass
class Node:
    """One pod: a network namespace plus, for every command run in it, a UTS namespace with the
    pod's hostname and a mount namespace with the pod's volumes (see init.sh in its dir)."""

    pod: dict[str, Any]
    netns: str
    ip: str
    dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def container(self) -> dict[str, Any]:
        return dict(self.pod["spec"]["containers"][0])

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--", "/bin/sh", str(self.dir / "init.sh"),
                *argv]

    def prepare(self, objects: Mapping[str, Mapping[str, Any]], hosts: str) -> None:
        """Project the volumes and write init.sh: set the hostname, overlay each mount's parent
        directory (so the mount point can exist without creating it on the host), put /etc/hosts
        and /etc/hostname in the /etc overlay, bind each volume at its mountPath, then exec."""
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        mounts = self.container.get("volumeMounts") or []
        lines = ["set -eu", f"hostname {self.name}"]
        parents = {"/etc"} | {str(Path(m["mountPath"]).parent) for m in mounts}
        for parent in sorted(parents):
            upper = self.dir / "overlay" / parent.strip("/").replace("/", "_")
            (upper / "upper").mkdir(parents=True)
            (upper / "work").mkdir()
            for m in mounts:
                if str(Path(m["mountPath"]).parent) == parent:
                    (upper / "upper" / Path(m["mountPath"]).name).mkdir()
            if parent == "/etc":
                (upper / "upper" / "hosts").write_text(hosts)
                (upper / "upper" / "hostname").write_text(self.name + "\n")
            lines.append(f"mount -t overlay overlay -o lowerdir={parent},upperdir={upper}/upper,"
                         f"workdir={upper}/work {parent}")
        for m in mounts:
            source = self.dir / "volumes" / m["name"]
            project_volume(volumes[m["name"]], objects, source)
            lines.append(f"mount --bind {source} {m['mountPath']}")
            if m.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {m['mountPath']}")
        lines.append('exec "$@"')
        (self.dir / "init.sh").write_text("\n".join(lines) + "\n")
        self.env = {e["name"]: e["value"] for e in self.container.get("env") or [] if "value" in e}


@dataclass
class Cluster:
    job: GeneratedJob
    launcher: Node
    workers: list[Node]
    dir: Path

    def mpirun(self, args: list[str], log_name: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """mpirun in the launcher, with the generated pod's env and no hostfile or host flags."""
        rank_env = [arg for name, value in RANK_ENV.items() for arg in ("-x", f"{name}={value}")]
        env = {**IMAGE_ENV, **self.launcher.env, **RUN_AS_ROOT}
        argv = self.launcher.command(["mpirun", *rank_env, *args])
        try:
            proc = subprocess.run(argv, env=env, cwd=self.dir, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"mpirun did not finish in {timeout}s:\n{e.stdout!s}\n{e.stderr!s}") from e
        env_lines = "".join(f"{name}={value}\n" for name, value in sorted(env.items()))
        (self.dir / f"{log_name}.log").write_text(f"{env_lines}$ {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
        assert proc.returncode == 0, f"mpirun exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        return proc


def hosts_file(node: str, ips: Mapping[str, str]) -> str:
    """The kubelet's /etc/hosts for a pod with hostname+subdomain, plus the records the cluster
    DNS serves for the job's headless Service (`<pod>.<job>.<ns>.svc`)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{ips[node]}\t{node}.{JOB}.{NAMESPACE}.svc.cluster.local\t{node}", "# cluster DNS"]
    lines += [f"{ip}\t{name}.{JOB}.{NAMESPACE}.svc" for name, ip in ips.items()]
    return "\n".join(lines) + "\n"


def kill_namespace_processes(netns: str) -> None:
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        deadline = time.monotonic() + wait
        while True:
            pids = run(["ip", "netns", "pids", netns], check=False).stdout.split()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), sig)
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)


def reap_leftovers() -> None:
    """Namespaces left by a test process that was killed before its teardown (the name carries
    its pid); those of a live process, such as a parallel run, are left alone."""
    for line in run(["ip", "netns", "list"]).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NETNS_PREFIX):
            continue
        pid = name[len(NETNS_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            kill_namespace_processes(name)
            run(["ip", "netns", "del", name], check=False)


def wait_for_sshd(node: Node, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if "Server listening on" in log.read_text():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"sshd in {node.name} did not start (exit {proc.poll()}):\n{log.read_text()}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    require_host()
    job = generate_job()
    reap_leftovers()
    run_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    switch = f"{NETNS_PREFIX}{run_id}-switch"
    namespaces: list[str] = []
    sshds: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    try:
        run(["ip", "netns", "add", switch])
        namespaces.append(switch)
        run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", switch, "link", "set", "br0", "up"])
        names = [pod_name(JOB, "launcher", 0)] + [pod_name(JOB, "worker", i) for i in range(WORKERS)]
        ips = {names[0]: LAUNCHER_IP} | {name: f"{SUBNET}.{20 + i}" for i, name in enumerate(names[1:])}
        nodes = []
        for i, name in enumerate(names):
            netns = f"{NETNS_PREFIX}{run_id}-{i}"
            run(["ip", "netns", "add", netns])
            namespaces.append(netns)
            # The pod's end of the pair is its eth0; the other end is a port on the switch's bridge.
            run(["ip", "-n", switch, "link", "add", f"port{i}", "type", "veth", "peer", "name", "eth0",
                 "netns", netns])
            run(["ip", "-n", switch, "link", "set", f"port{i}", "master", "br0", "up"])
            run(["ip", "-n", netns, "addr", "add", f"{ips[name]}/24", "dev", "eth0"])
            run(["ip", "-n", netns, "link", "set", "eth0", "up"])
            run(["ip", "-n", netns, "link", "set", "lo", "up"])
            node = Node(job.pods[name], netns, ips[name], tmp_path / name)
            node.dir.mkdir()
            node.prepare(job.objects, hosts_file(name, ips))
            nodes.append(node)
        launcher, workers = nodes[0], nodes[1:]

        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir (Debian)
        for worker in workers:
            command = worker.container.get("command")
            assert command == mpi.WORKER_SSHD, f"worker {worker.name} runs {command}, not the operator's sshd"
            host_key = worker.dir / "ssh_host_ed25519_key"
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)])
            config = worker.dir / "sshd_config"
            config.write_text(SSHD_CONFIG.format(ip=worker.ip, host_key=host_key, pid_file=worker.dir / "sshd.pid"))
            log_path = worker.dir / "sshd.log"
            log_file = open(log_path, "wb")  # noqa: SIM115 - sshd writes to it until teardown
            logs.append(log_file)
            sshds.append(subprocess.Popen(worker.command([*command, "-f", str(config)]), env=IMAGE_ENV,
                                          stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True))
            wait_for_sshd(worker, sshds[-1], log_path)

        # Fail early and clearly if plain ssh with the Secret's key and config can't reach a worker.
        for i, worker in enumerate(workers):
            fqdn = pod_fqdn(JOB, NAMESPACE, "worker", i)
            ssh = subprocess.run(launcher.command(["ssh", fqdn, "hostname"]), env=IMAGE_ENV, capture_output=True,
                                 text=True, timeout=30)
            assert ssh.returncode == 0 and ssh.stdout.strip() == worker.name, (
                f"ssh {fqdn} from the launcher: exit {ssh.returncode}, out {ssh.stdout!r}, err {ssh.stderr!r}\n"
                f"sshd log:\n{(worker.dir / 'sshd.log').read_text()}")

        yield Cluster(job, launcher, workers, tmp_path)
    finally:
        for netns in namespaces:
            kill_namespace_processes(netns)
        for sshd in sshds:
            try:
                sshd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sshd.kill()
        for log in logs:
            log.close()
        for netns in reversed(namespaces):
            run(["ip", "netns", "del", netns], check=False)


def netns_inode(netns: str) -> int:
    return os.stat(f"/run/netns/{netns}").st_ino


def read_ranks(result_dir: Path, size: int) -> list[dict[str, Any]]:
    files = sorted(result_dir.glob("rank-*.json"))
    assert len(files) == size, f"expected {size} rank results, got {[f.name for f in files]}"
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])


def test_mpirun_allreduce_across_workers(cluster: Cluster) -> None:
    results = cluster.dir / "allreduce"
    results.mkdir()
    cluster.mpirun(["-np", str(WORKERS), str(HVD_PYTHON), str(RANK_SCRIPTS / "allreduce.py"), str(results),
                    LAUNCHER_IP], "allreduce", timeout=120)
    ranks = read_ranks(results, WORKERS)
    for rank in ranks:
        assert rank["size"] == WORKERS
        assert rank["sum"] == [1.0 + 2.0, 1.0 + 10.0], rank  # rank r sent [r+1, 10**r]
        assert "Open MPI v4.1" in rank["mpi_library"], rank["mpi_library"]
    # One rank per worker (slots=1 each, hostfile order), none on the launcher.
    assert [r["hostname"] for r in ranks] == [w.name for w in cluster.workers]
    assert [r["processor_name"] for r in ranks] == [w.name for w in cluster.workers]
    assert [r["address"] for r in ranks] == [w.ip for w in cluster.workers]
    assert [r["netns_inode"] for r in ranks] == [netns_inode(w.netns) for w in cluster.workers]
    assert ranks[0]["all_hosts"] == [w.name for w in cluster.workers]


def test_horovod_keras_training_across_workers(cluster: Cluster) -> None:
    results = cluster.dir / "horovod"
    results.mkdir()
    cluster.mpirun(["-np", str(WORKERS), str(HVD_PYTHON), str(RANK_SCRIPTS / "hvd_train.py"), str(results)],
                   "horovod", timeout=420)
    ranks = read_ranks(results, WORKERS)
    assert [r["hostname"] for r in ranks] == [w.name for w in cluster.workers]
    for rank in ranks:
        assert rank["size"] == WORKERS and rank["local_rank"] == 0 and rank["mpi_enabled"], rank
        assert rank["tensorflow"].startswith("2.15."), rank["tensorflow"]
        losses = rank["loss"]
        assert losses[-1] < 0.5 * losses[0], f"rank {rank['rank']}'s loss did not go down: {losses}"
    # Different starting points (per-rank seeds), the same end: broadcast + averaged gradients.
    assert ranks[0]["initial_weights"] != ranks[1]["initial_weights"]
    assert ranks[0]["final_weights"] == ranks[1]["final_weights"], (ranks[0]["final_weights"],
                                                                    ranks[1]["final_weights"])
