"""The real node's GPUs through DRA: dra-example-driver's kubelet plugin (v0.2.0), as a process.

The plugin publishes the node's ResourceSlice (driver gpu.example.com, pool real-node-0: eight fake
GPUs gpu-0..gpu-7 with model, uuid, index, driverVersion and memory; hack/fakedra.py writes the
KWOK nodes' alike), registers with the kubelet (a socket in its plugins_registry folder), and when
the kubelet prepares a claim allocated on this node it writes a CDI spec for it into the node's CDI
folder. containerd (2.x: CDI is on) applies that spec to the container: for each device the
environment GPU_DEVICE_<n>=gpu-<n>, GPU_DEVICE_<n>_RESOURCE_CLAIM=<the claim's UID> and its sharing
settings, plus DRA_RESOURCE_DRIVER_NAME and KUBERNETES_NODE_NAME (the driver's cdi.go). The devices
are fake: no device node is mounted.

Known: v0.2.0 serves no DRAResourceHealth (device health, alpha), so the kubelet logs "unknown
service v1alpha1.DRAResourceHealth" every 5 s; harmless. Nothing watches the plugin after start-up
(the plane's check_alive runs at `up`); if it died, the kubelet would drop the node's slice and a
DRA pod would stay Pending, which the e2e test reports as a timeout naming its pods.

The DeviceClass is hack/fakedra.py's (`device.driver == "gpu.example.com"`), created here as the
driver's chart would. The plugin uses the plane's admin kubeconfig (copied into the node's folder,
which names its process as the node's for `realnode.leftovers`); in a cluster it runs as a
DaemonSet with its own service account.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from fakedra import DEVICES_PER_NODE, FAKE_GPU_CLASS, FAKE_GPU_DRIVER, device_class

NAME = "dra-example-kubeletplugin"


class Plane(Protocol):
    root: Path

    def spawn(self, name: str, argv: list[str]) -> None: ...
    def wait(self, what: str, ready: Any, deadline: float, interval: float = 0.2) -> None: ...
    def api(self, method: str, path: str, body: Any = None, *, allow_missing: bool = False,
            content_type: str = "application/json") -> Any: ...


# A unix socket's path holds at most 107 bytes (sun_path); the kubelet's folders are under the
# clone's path, so a deep checkout could not bind them.
SOCKET_PATH_MAX = 107


def argv(binary: Path, kubeconfig: Path, node: str, kubelet_dir: Path, cdi_dir: Path) -> list[str]:
    # NODE_NAME in the environment too: the plugin's CDI spec reads it from there (KUBERNETES_NODE_NAME).
    return ["env", f"NODE_NAME={node}", str(binary), f"--kubeconfig={kubeconfig}", f"--node-name={node}",
            f"--cdi-root={cdi_dir}", f"--num-devices={DEVICES_PER_NODE}",
            f"--kubelet-registrar-directory-path={kubelet_dir / 'plugins_registry'}",
            f"--kubelet-plugins-directory-path={kubelet_dir / 'plugins'}",
            "--healthcheck-port=-1", "--v=2"]


def start(plane: Plane, binary: Path, node_dir: Path, kubelet_dir: Path, node: str, cdi_dir: Path,
          deadline: float) -> None:
    """The DeviceClass, then the plugin; ready when the node's slice lists its devices and the
    plugin's two sockets are up. The plugin publishes its slice without waiting for the kubelet; the
    kubelet's plugin watcher registers it within a second of its registration socket appearing, and
    a pod it prepares before that is retried ("driver not registered"), not failed."""
    too_long = [str(s) for s in sockets(kubelet_dir) if len(str(s).encode()) > SOCKET_PATH_MAX]
    if too_long:
        raise RuntimeError(f"the DRA plugin's sockets would be longer than {SOCKET_PATH_MAX} bytes, which a unix "
                           f"socket can't bind: {too_long}; clone the repository into a shorter path")
    if plane.api("GET", f"/apis/resource.k8s.io/v1/deviceclasses/{FAKE_GPU_CLASS}", allow_missing=True) is None:
        plane.api("POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class())
    kubeconfig = node_dir / f"{NAME}.kubeconfig"
    with open(os.open(kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write((plane.root / "kubeconfig").read_text())
    # A fresh node: no CDI spec or prepared-claims checkpoint of an earlier cluster's claims.
    shutil.rmtree(cdi_dir, ignore_errors=True)
    shutil.rmtree(kubelet_dir / "plugins" / FAKE_GPU_DRIVER, ignore_errors=True)
    cdi_dir.mkdir(parents=True)
    plane.spawn(NAME, argv(binary, kubeconfig, node, kubelet_dir, cdi_dir))
    plane.wait(f"{node}'s ResourceSlice of {DEVICES_PER_NODE} devices and the DRA plugin's sockets",
               lambda: published(plane, node) == DEVICES_PER_NODE and all(s.is_socket() for s in sockets(kubelet_dir)),
               deadline, 0.5)


def published(plane: Plane, node: str) -> int:
    """How many devices the driver's slices list for the node."""
    slices = plane.api("GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{node}")
    return sum(len(s["spec"].get("devices") or []) for s in slices["items"] if s["spec"]["driver"] == FAKE_GPU_DRIVER)


def sockets(kubelet_dir: Path) -> list[Path]:
    """The plugin's sockets: the one the kubelet's plugin watcher registers it through, and the one
    the kubelet prepares claims through."""
    return [kubelet_dir / "plugins_registry" / f"{FAKE_GPU_DRIVER}-reg.sock",
            kubelet_dir / "plugins" / FAKE_GPU_DRIVER / "dra.sock"]
