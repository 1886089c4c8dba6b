"""Kubernetes older than 1.30: the chart still renders offline (no kubeVersion in Chart.yaml), but
helm against such a cluster and the operator both stop with a message naming the version. The
cluster is a fake that answers only version, discovery and helm's Secret list."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fake_apiserver import old_apiserver
from support import ROOT

CHART = ROOT / "charts" / "disttrain-operator"
HELM = ROOT / ".cache" / "bin" / "helm"


def test_helm_install_on_an_old_cluster_says_why(tmp_path: Path) -> None:
    with old_apiserver(tmp_path, "1.29.4") as kubeconfig:
        result = subprocess.run([str(HELM), "install", "dt", str(CHART), "--namespace", "dt", "--dry-run=server"],
                                capture_output=True, text=True, env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                                timeout=60)
    assert result.returncode != 0
    assert "needs Kubernetes 1.30 or later" in result.stderr and "v1.29.4" in result.stderr, result.stderr


def test_helm_template_offline_checks_nothing() -> None:
    """Offline, helm's version is a placeholder: even an explicit old --kube-version renders (the
    operator checks at start-up)."""
    for args in ([], ["--kube-version", "1.29.0"]):
        result = subprocess.run([str(HELM), "template", "dt", str(CHART), *args], capture_output=True, text=True,
                                env={**os.environ, "KUBECONFIG": "/nonexistent"}, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "kind: Deployment" in result.stdout


def test_operator_on_an_old_cluster_exits_with_a_clear_line(tmp_path: Path) -> None:
    with old_apiserver(tmp_path, "1.29.4") as kubeconfig:
        result = subprocess.run([sys.executable, "-m", "disttrain", "run"], capture_output=True, text=True,
                                env={**os.environ, "KUBECONFIG": str(kubeconfig)}, timeout=60)
    assert result.returncode == 1
    assert ("ERROR disttrain: disttrain needs Kubernetes 1.30 or later (CRD validation rules in CEL, server-side "
            "apply); this API server runs v1.29.4") in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
