"""The real node's NetworkPolicy firewall: kube-router's network-policy controller, alone.

The bridge CNI plugin enforces no NetworkPolicy, so the node runs kube-router with only its
firewall (`--run-firewall`, no router, no service proxy, no load-balancer allocator): it watches
pods, namespaces and NetworkPolicies and programs iptables (chains KUBE-ROUTER-*, KUBE-POD-FW-*,
KUBE-NWPLCY-*) and ipsets (KUBE-SRC-*, KUBE-DST-*) on this machine. Pods talk across the bridge
`dt0`; bridged packets reach iptables' FORWARD chain because `net.bridge.bridge-nf-call-iptables`
is 1 (the kernel's br_netfilter, built in here; realnode.create_bridge makes sure), and kube-router
matches them with `physdev`.
It treats as its own the pods whose hostIP is the node's InternalIP (10.89.0.1), so the KWOK
nodes' pods are peers in its ipsets and nothing more.

kube-router v2.1.0 is the only version the Go module proxy serves (by exact version), and security
flaws are reported against it: it runs on the local test node only and is never in an image or the
chart (hack/kube/tools_kuberouter.go builds it in hack/kube's graph).

Known: its sync saves the whole filter table and restores it (iptables-restore without --noflush,
pkg/utils/iptables.go; kube-router#1372), so a kube-proxy filter rule changed in between may be
undone until kube-proxy's next sync. kube-proxy's Service rules are in the nat table, untouched.

It leaves its chains and ipsets behind when it stops (that is how it keeps enforcing across its own
restarts): `remove_ipsets` takes its ipsets away after the node's pods and chains are gone, and
`leftovers` is what `make cluster-down` checks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Protocol

from ports import free_port, http_ok

NAME = "kube-router"
# Its ipsets (pkg/controllers/netpol/network_policy_controller.go, pkg/utils/ipset.go): KUBE-SRC-
# and KUBE-DST- and 16 base32 characters of a hash, TMP- sets the ones it swaps in during a sync;
# inet6: names IPv6 sets (not enabled here). Its chains are KUBE-ROUTER-*, KUBE-POD-FW-* and
# KUBE-NWPLCY-*: realnode.remove_iptables_chains takes every KUBE- chain.
IPSET_NAME = re.compile(r"^(inet6:)?(KUBE-SRC|KUBE-DST|TMP)-[A-Z2-7]{16}$")


class Plane(Protocol):
    root: Path

    def spawn(self, name: str, argv: list[str]) -> None: ...
    def wait(self, what: str, ready: Any, deadline: float, interval: float = 0.2) -> None: ...


def argv(binary: Path, kubeconfig: Path, node: str, service_cidr: str, health_port: int) -> list[str]:
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--hostname-override={node}",
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
            # Traffic from pods to Service VIPs is let through to kube-proxy's DNAT (the policy then
            # applies to the pod behind it, on the FORWARD chain).
            f"--service-cluster-ip-range={service_cidr}",
            f"--health-port={health_port}", "--metrics-port=0", "--v=1"]


def start(plane: Plane, binary: Path, node_dir: Path, node: str, service_cidr: str, deadline: float) -> None:
    """Start the firewall and wait until it is healthy (its informers synced) and has hooked its
    chains into FORWARD; its first full sync follows at once, and a pod's own rules come with the
    sync its IP triggers (tests/e2e waits for them). Its kubeconfig (the plane's admin) is copied
    into the node's folder, which names its process as the node's for `leftovers`."""
    kubeconfig = node_dir / f"{NAME}.kubeconfig"
    with open(os.open(kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write((plane.root / "kubeconfig").read_text())
    health = free_port()
    plane.spawn(NAME, argv(binary, kubeconfig, node, service_cidr, health))
    healthz = f"http://127.0.0.1:{health}/healthz"
    plane.wait("kube-router's firewall hooked", lambda: http_ok(healthz) and _hooked(), deadline, 0.5)


def _hooked() -> bool:
    forward = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    return "-j KUBE-ROUTER-FORWARD" in forward


def ipsets() -> list[str]:
    """kube-router's ipsets on this machine (none where ipset isn't installed: a node started before
    the firewall came, being taken down)."""
    if shutil.which("ipset") is None:
        return []
    listed = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True)
    return [name for name in listed.stdout.split() if IPSET_NAME.match(name)]


def remove_ipsets() -> None:
    """Its ipsets, once no iptables rule refers to them (realnode removes the KUBE- chains first)."""
    for name in ipsets():
        subprocess.run(["ipset", "destroy", name], capture_output=True)


def leftovers() -> list[str]:
    return [f"ipset {name}" for name in ipsets()]
