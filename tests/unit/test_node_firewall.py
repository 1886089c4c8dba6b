"""The real node's NetworkPolicy firewall (hack/netpolicy.py, issue 32): kube-router started with
its firewall alone, as one of the plane's processes, so the plane names it at once if it exits
while the node starts, as it does every component (LocalCluster.wait)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import netpolicy
from localcluster import ComponentDied, LocalCluster


def test_only_the_firewall_runs() -> None:
    argv = netpolicy.argv(Path("/bin/kube-router"), Path("/k"), "real-node-0", "10.96.0.0/16", 20244)
    assert {"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--run-loadbalancer=false", "--hostname-override=real-node-0",
            "--service-cluster-ip-range=10.96.0.0/16", "--metrics-port=0"} <= set(argv)


def test_a_firewall_that_exits_is_named_with_its_log(tmp_path: Path) -> None:
    plane = LocalCluster(root=tmp_path / "plane")
    (plane.root / "logs").mkdir(parents=True)
    (plane.root / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    node_dir = plane.root / "node"
    node_dir.mkdir()
    crashing = tmp_path / "kube-router"
    crashing.write_text("#!/bin/sh\necho 'failed to create network policy controller: no node'\nexit 1\n")
    crashing.chmod(0o755)
    started = time.monotonic()
    try:
        with pytest.raises(ComponentDied, match=r"(?s)^kube-router exited.*exit 1.*no node"):
            netpolicy.start(plane, crashing, node_dir, "real-node-0", "10.96.0.0/16", time.monotonic() + 60)
    finally:
        plane.children.pop(netpolicy.NAME).wait()
    assert time.monotonic() - started < 10, "named at once, not at the deadline"
    assert (node_dir / "kube-router.kubeconfig").stat().st_mode & 0o077 == 0, "its credentials kept private"
