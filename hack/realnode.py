"""A real node for the local control plane: containerd, the CNI bridge, a kubelet, CoreDNS,
kube-proxy, a NetworkPolicy firewall (kube-router's, hack/netpolicy.py) and a DRA driver's kubelet
plugin with eight fake GPUs (dra-example-driver's, hack/nodedra.py) on this machine, beside the KWOK
nodes (`LocalCluster(real_node=True)`).

Pods get their own network namespace and an address on the bridge `dt0` (10.89.0.0/24); the host
is 10.89.0.1 there, where the API server, the kubelet and CoreDNS listen. Nothing is forwarded
off the bridge (ip_forward stays as it is, 0 here): pods reach each other and the host, and
kube-proxy's DNAT turns the `kubernetes` Service's 10.96.0.1 into the API server, so in-cluster
clients work unchanged. The node is tainted and labelled `disttrain.dev/real-node=true`: only pods
that ask for it (a toleration and a nodeSelector) land there.

Facts this rests on (measured on these machines, cgroup v1; containerd 1.6.20 from Debian first,
2.4.2 built here since, with Debian's runc 1.1.5):
- kubelet 1.35+ refuses cgroup v1 unless `failCgroupV1: false`;
- runc can't lower its OOM score here ("failed to update /proc/self/oom_score_adj: Permission
  denied", every sandbox failing with "can't get final child's PID from pipe: EOF") until the CRI
  config says `restrict_oom_score_adj = true`;
- a DRA driver hands a container its devices by CDI, which containerd 1.6 lacks (1.7 added it, 2.x
  has it on): the node runs containerd 2 (config version 3) with the driver's CDI folder;
- no registry is reachable: images come from archives (hack/images.py), the sandbox image too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import netpolicy
import nodedra
import pki
import registry
from ociimage import archive_manifest
from ports import free_port

REPO = Path(__file__).resolve().parent.parent
NODE_NAME = "real-node-0"
NODE_KEY = "disttrain.dev/real-node"  # the node's label and taint: pods that want it say so
BRIDGE, SUBNET, GATEWAY = "dt0", "10.89.0.0/24", "10.89.0.1"
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
DAEMONS = ("kubelet", "kube-proxy", "coredns", netpolicy.NAME, nodedra.NAME)  # stopped before containerd
# Kept across clusters, so an image is pulled once (from the plane's registry, hack/registry.py); one
# per containerd major version (2.x migrates a 1.x store, and 1.x can't read it back).
CONTAINERD_ROOT = REPO / ".cache" / "node" / "containerd-2"
IMAGE_ARCHIVES = REPO / ".cache" / "images"
STATE = Path("/run/disttrain-node")  # containerd's state and socket: tmpfs, a short path
SOCKET = STATE / "containerd.sock"
CDI_DIR = STATE / "cdi"  # the DRA driver's CDI specs, which containerd reads
PAUSE_IMAGE = "docker.io/disttrain/pause:3.10"
# Annotations that pin a namespace's pods to the real node (PodNodeSelector and
# PodTolerationRestriction admission, enabled in the local plane's API server).
NAMESPACE_ANNOTATIONS = {
    "scheduler.alpha.kubernetes.io/node-selector": f"{NODE_KEY}=true",
    "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(
        [{"key": NODE_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]),
}


class Plane(Protocol):
    """What the node needs of the control plane it joins (a LocalCluster)."""

    root: Path
    server: str
    service_cidr: str

    def spawn(self, name: str, argv: list[str]) -> None: ...
    def wait(self, what: str, ready: Callable[[], object], deadline: float, interval: float = 0.2) -> None: ...
    def api(self, method: str, path: str, body: Any = None, *, allow_missing: bool = False,
            content_type: str = "application/json") -> Any: ...


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def ctr(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(str(bin_path("ctr")), "--address", str(SOCKET), "--namespace", "k8s.io", *argv, check=check)


def mount_netns_folder() -> None:
    """/run/netns a mount point of its own, shared, before containerd bind-mounts a pod's network
    namespace in it, as `ip netns add` makes it the first time it runs (iproute2's
    create_netns_dir). Left to `ip netns` (test_real_mpi.py, in another lane), that first mount
    came over the folder with pods' namespaces already mounted in it and hid them: containerd's
    unmount then missed each one, its unlink failed with EBUSY, and the pods stayed Terminating
    (a fresh machine's make test: the standby test waited 120 s for the old leader's pod to go,
    and two cni-* namespaces outlived the node). Mount IDs said it: the folder's mount (138) came
    after the two namespaces' (92, 133) on the same parent."""
    folder = Path("/run/netns")
    folder.mkdir(parents=True, exist_ok=True)
    # Recursive, as iproute2's (MS_REC): namespaces a crashed run left mounted there stay in view.
    if run("mountpoint", "-q", str(folder), check=False).returncode != 0:
        run("mount", "--rbind", str(folder), str(folder))
    run("mount", "--make-rshared", str(folder))


def create_bridge() -> None:
    """The pods' bridge with the host's address on it, made before the API server binds there; and
    bridged packets handed to iptables (kubeadm's preflight asks for it too), without which the
    NetworkPolicy firewall never sees pod-to-pod traffic (kube-router sets it only from its router,
    which does not run here)."""
    if BRIDGE_NF.exists() and BRIDGE_NF.read_text().strip() != "1":
        BRIDGE_NF.write_text("1")
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")


class RealNode:
    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.dir = plane.root / "node"
        self.pki = plane.root / "pki"

    # -- up ------------------------------------------------------------------------------------

    def up(self, deadline: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        pki.node_identity(self.pki, NODE_NAME, GATEWAY)
        (self.dir / "kubelet.kubeconfig").write_text(pki.kubeconfig_text(self.plane.server, self.pki,
                                                                         "kubelet-client"))
        self._start_containerd(deadline)
        import_pause_image()
        self._start_registry(deadline)
        self._start_coredns()
        self._start_kubelet()
        self._wait_node_ready(deadline)
        self._start_kube_proxy()
        netpolicy.start(self.plane, bin_path(netpolicy.NAME), self.dir, NODE_NAME, self.plane.service_cidr, deadline)
        nodedra.start(self.plane, bin_path(nodedra.NAME), self.dir, self.dir / "kubelet", NODE_NAME, CDI_DIR, deadline)

    def _start_containerd(self, deadline: float) -> None:
        mount_netns_folder()
        STATE.mkdir(parents=True, exist_ok=True)
        CONTAINERD_ROOT.mkdir(parents=True, exist_ok=True)
        cni = self.dir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-disttrain.conflist").write_text(json.dumps(cni_config(self.dir / "ipam"), indent=2))
        config = self.dir / "containerd.toml"
        hosts = self.dir / "registry-hosts"
        registry_hosts(hosts, self.pki / "ca.crt")
        config.write_text(containerd_config(cni, hosts))
        self.plane.spawn("containerd", [str(bin_path("containerd")), "--config", str(config)])
        self.plane.wait("containerd started", lambda: SOCKET.exists() and ctr("version", check=False).returncode == 0,
                        deadline)

    def _start_registry(self, deadline: float) -> None:
        """The plane's registry, with every image `make images` built pushed to it: the node pulls
        them as a cluster's node does, by a pod's (or its ServiceAccount's) pull secret."""
        local = registry.Registry(self.plane.root)
        local.start(self.plane.spawn, self.plane.wait, deadline)
        local.push_all()

    def _start_coredns(self) -> None:
        corefile = self.dir / "Corefile"
        corefile.write_text(COREFILE.format(ip=GATEWAY, kubeconfig=self.plane.root / "kubeconfig"))
        self.plane.spawn("coredns", [str(bin_path("coredns")), "-conf", str(corefile)])

    def _start_kubelet(self) -> None:
        config = self.dir / "kubelet.yaml"
        config.write_text(json.dumps(kubelet_config(self.pki), indent=2))
        self.plane.spawn("kubelet", [
            str(bin_path("kubelet")), f"--config={config}", f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.dir / 'kubelet'}", f"--hostname-override={NODE_NAME}", f"--node-ip={GATEWAY}",
            f"--node-labels={NODE_KEY}=true", "--v=1"])

    def _start_kube_proxy(self) -> None:
        config = self.dir / "kube-proxy.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.plane.root / "kubeconfig")},
            "hostnameOverride": NODE_NAME, "mode": "iptables", "clusterCIDR": SUBNET,
            "bindAddress": GATEWAY, "nodePortAddresses": [f"{GATEWAY}/32"],
            "healthzBindAddress": f"127.0.0.1:{free_port()}", "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the host's conntrack settings as they are.
            "conntrack": {"maxPerCore": 0, "min": 0},
        }))
        self.plane.spawn("kube-proxy", [str(bin_path("kube-proxy")), f"--config={config}", "--v=1"])

    def _wait_node_ready(self, deadline: float) -> None:
        conditions: list[dict[str, Any]] = []

        def ready() -> bool:
            node = self.plane.api("GET", f"/api/v1/nodes/{NODE_NAME}", allow_missing=True)
            conditions[:] = (node or {}).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        try:
            self.plane.wait(f"node {NODE_NAME} Ready", ready, deadline, 0.5)
        except TimeoutError as err:
            raise TimeoutError(f"{err}: {conditions}") from None

    # -- down ----------------------------------------------------------------------------------

    def drain(self, timeout: float = 60) -> None:
        """Delete the node's pods through the API and let the kubelet tear down their sandboxes
        (that is what releases their network namespaces and veths through CNI)."""
        with contextlib.suppress(Exception):
            self.plane.api("PATCH", f"/api/v1/nodes/{NODE_NAME}", {"spec": {"unschedulable": True}},
                           content_type="application/merge-patch+json")
            pods = self.plane.api("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE_NAME}")["items"]
            for pod in pods:
                meta = pod["metadata"]
                self.plane.api("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                               {"gracePeriodSeconds": 0}, allow_missing=True)
            end = time.monotonic() + timeout
            while time.monotonic() < end and sandboxes():
                time.sleep(0.5)

    def down(self) -> None:
        """Everything the node left behind, gone: containers, mounts, network namespaces, veths,
        iptables chains, cgroups. Safe to call on a half-started or long-dead node."""
        remove_containers()
        remove_iptables_chains()
        netpolicy.remove_ipsets()
        remove_network()
        unmount_under(self.dir, STATE, CONTAINERD_ROOT)
        remove_cgroups()


# -- pieces ------------------------------------------------------------------------------------


def pinned_namespace(name: str) -> dict[str, Any]:
    """A Namespace whose pods all land on the real node."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": NAMESPACE_ANNOTATIONS}}


def claim_volume(namespace: str, claim: str, folder: Path) -> dict[str, Any]:
    """A hostPath PersistentVolume on the node for the claim `namespace/claim`: the shared volume
    (ReadWriteMany) the examples' checkpoints go to, on a single node."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)  # the examples' containers may run as any user
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"{namespace}-{claim}", "labels": {"disttrain.dev/claim-namespace": namespace}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(folder)},
                     "claimRef": {"namespace": namespace, "name": claim}}}


def ready_to_run() -> bool:
    """Whether this machine has what a real node needs: its binaries (make binaries), the
    Debian packages (make node) and the images (make images)."""
    tools = ["/usr/sbin/runc", "/usr/lib/cni/bridge", "/usr/sbin/ipset"]
    ours = ("kubelet", "kube-proxy", "coredns", "containerd", "containerd-shim-runc-v2", "ctr", netpolicy.NAME,
            nodedra.NAME)
    return all(bin_path(b).exists() for b in ours) and \
        all(Path(t).exists() for t in tools) and (IMAGE_ARCHIVES / "pause.tar").exists()


def bin_path(name: str) -> Path:
    return Path(os.environ.get("DISTTRAIN_BIN_ROOT", REPO / ".cache" / "bin")) / name


def cni_config(ipam_dir: Path) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "disttrain", "plugins": [{
        "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
        "ipam": {"type": "host-local", "dataDir": str(ipam_dir), "routes": [{"dst": "0.0.0.0/0"}],
                 "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]]}}]}


def registry_hosts(hosts_dir: Path, ca: Path) -> None:
    """containerd's hosts.toml for the plane's registry: its CA (the plane's), nothing else; the
    credentials come from the pod's pull secret, by kubelet."""
    folder = hosts_dir / registry.ADDRESS
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts.toml").write_text(f'server = "https://{registry.ADDRESS}"\n\n'
                                       f'[host."https://{registry.ADDRESS}"]\n  capabilities = ["pull", "resolve"]\n'
                                       f'  ca = "{ca}"\n')


def containerd_config(cni_dir: Path, hosts_dir: Path) -> str:
    """containerd 2's configuration (version 3): the CRI's image and runtime halves are plugins of
    their own. Our shim (built beside containerd) by path, Debian's runc by path, CDI specs from the
    node's own folder only (not the host's /etc/cdi). NRI off: on, containerd 2 takes the host's
    /var/run/nri/nri.sock and starts the plugins in /opt/nri/plugins, neither the node's."""
    images, runtime = 'plugins."io.containerd.cri.v1.images"', 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
root = "{CONTAINERD_ROOT}"
state = "{STATE / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]
[grpc]
  address = "{SOCKET}"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[{images}]
  snapshotter = "overlayfs"
[{images}.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[{images}.registry]
  config_path = "{hosts_dir}"
[{runtime}]
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{CDI_DIR}"]
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{bin_path('containerd-shim-runc-v2')}"
[{runtime}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "/usr/sbin/runc"
[{runtime}.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "{cni_dir}"
"""


def kubelet_config(pki_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{SOCKET}",
        "address": GATEWAY, "port": 10250, "readOnlyPort": 0, "healthzPort": 0,
        "tlsCertFile": str(pki_dir / "kubelet-server.crt"), "tlsPrivateKeyFile": str(pki_dir / "kubelet-server.key"),
        # The API server (logs, exec) presents the admin cert of the same CA.
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(pki_dir / "ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [GATEWAY], "clusterDomain": "cluster.local", "resolvConf": "",
        "registerWithTaints": [{"key": NODE_KEY, "value": "true", "effect": "NoSchedule"}],
        "failSwapOn": False, "serializeImagePulls": False,
        # Images can't be pulled again here: never collect them; and this shared machine's disk
        # says nothing about the node's health.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
    }


COREFILE = """cluster.local:53 {{
    bind {ip}
    errors
    kubernetes cluster.local {{
        kubeconfig {kubeconfig}
    }}
    cache 5
}}
"""


def import_pause_image() -> None:
    """The pod sandbox's image, imported: it is the node's, as a cluster's nodes carry theirs, and
    containerd pulls it without a pod's credentials. Every other image the node pulls."""
    present = {line.split()[0]: line.split()[2] for line in ctr("images", "ls").stdout.splitlines()[1:] if line}
    name, digest = archive_image(IMAGE_ARCHIVES / "pause.tar")
    if present.get(name) != digest:
        ctr("images", "import", "--no-unpack", str(IMAGE_ARCHIVES / "pause.tar"))


def archive_image(archive: Path) -> tuple[str, str]:
    manifest = archive_manifest(archive)
    annotations = manifest["annotations"]
    # hack/ociimage.py names the image for containerd; buildah's archives in the OCI ref name.
    return annotations.get("io.containerd.image.name") or annotations["org.opencontainers.image.ref.name"], \
        manifest["digest"]


def sandboxes() -> list[str]:
    if not SOCKET.exists():
        return []
    return ctr("tasks", "ls", "-q", check=False).stdout.split()


def container_pid(container_id: str) -> int:
    """The host PID of a container's main process (`containerd://<id>` from a pod's status)."""
    task_id = container_id.removeprefix("containerd://")
    for line in ctr("tasks", "ls").stdout.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == task_id:
            return int(pid)
    raise LookupError(f"no running task {task_id}")


def remove_containers() -> None:
    """Kill and delete every container containerd still runs (the kubelet is gone by now)."""
    if not SOCKET.exists():
        return
    for task in sandboxes():
        ctr("tasks", "kill", "--signal", "SIGKILL", "--all", task, check=False)
    for task in sandboxes():
        for _ in range(50):
            if ctr("tasks", "delete", task, check=False).returncode == 0:
                break
            time.sleep(0.1)
    # containerd 2 keeps each pod sandbox in a store of its own and restores it at start: the
    # node's store outlives the cluster, so a sandbox left there would be the next cluster's.
    listed = ctr("sandboxes", "ls", check=False).stdout.splitlines()[1:]
    for sandbox in (line.split()[0] for line in listed if line.strip()):
        ctr("sandboxes", "rm", "--force", sandbox, check=False)
    for container in ctr("containers", "ls", "-q", check=False).stdout.split():
        ctr("containers", "delete", container, check=False)


def remove_iptables_chains() -> None:
    """kube-proxy's Service rules, the kubelet's own chains (KUBE-FIREWALL, its canaries) and
    kube-router's (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*): the jumps into them from the
    built-in chains first, then the chains."""
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = run(tool, "-t", table, "-S", check=False).stdout.splitlines()
            for rule in rules:
                if rule.startswith("-A ") and not rule.split()[1].startswith("KUBE-") and " -j KUBE-" in rule:
                    run(tool, "-t", table, "-D", *shlex.split(rule)[1:], check=False)
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            for verb in ("-F", "-X"):
                for chain in chains:
                    run(tool, "-t", table, verb, chain, check=False)


def remove_network() -> None:
    """CNI's network namespaces (cni-*), the bridge and with it every veth still attached."""
    netns = Path("/var/run/netns")
    for ns in netns.glob("cni-*") if netns.is_dir() else []:
        run("ip", "netns", "delete", ns.name, check=False)
    run("ip", "link", "delete", BRIDGE, check=False)


def mounts_under(*roots: Path) -> list[str]:
    prefixes = tuple(str(r.resolve()) + "/" for r in roots) + tuple(str(r.resolve()) for r in roots)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefixes):
            found.append(point)
    return found


def unmount_under(*roots: Path) -> None:
    for point in sorted(mounts_under(*roots), key=len, reverse=True):
        run("umount", "--lazy", point, check=False)


def remove_cgroups() -> None:
    """The kubelet's kubepods hierarchies, deepest first (an empty cgroup is removed by rmdir)."""
    for controller in Path("/sys/fs/cgroup").iterdir():
        top = controller / "kubepods"
        if not top.is_dir():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def leftovers(node_dir: Path) -> list[str]:
    """What a stopped node must not leave: for `make cluster-down` and its test."""
    found = [f"mount {m}" for m in mounts_under(node_dir, STATE, CONTAINERD_ROOT)]
    netns = Path("/var/run/netns")
    found += [f"netns {ns.name}" for ns in (netns.glob("cni-*") if netns.is_dir() else [])]
    links = run("ip", "-o", "link", "show").stdout
    found += [f"link {m}" for m in re.findall(r"^\d+: (veth[^@:]+)[@:]", links, re.M)]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"link {BRIDGE}")
    found += [f"iptables {table} {rule}" for table in ("filter", "nat") for rule in
              run("iptables", "-t", table, "-S", check=False).stdout.splitlines() if "KUBE-" in rule]
    found += netpolicy.leftovers()
    daemons = (f"containerd --config|containerd-shim|kubelet --config|coredns -conf|kube-router --kubeconfig|"
               f"{nodedra.NAME}")
    found += [f"process {line}" for line in run("pgrep", "-af", daemons, check=False).stdout.splitlines()
              if str(STATE) in line or str(node_dir) in line]
    return found
