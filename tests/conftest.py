"""Shared test setup: hack/ and tests/ on the path, and the cluster fixtures of the integration
and e2e tests: one real control plane per session (or the cluster DISTTRAIN_TEST_KUBECONFIG
names), the CRD installed, the operator running, a namespace per test.

The local plane gets a real node too (hack/realnode.py: containerd, kubelet, CoreDNS, kube-proxy,
kube-router's NetworkPolicy firewall)
when DISTTRAIN_REAL_NODE is 1 (`make test` and `make e2e` set it: no node is then a failure), or,
with the default `auto`, when this machine can run one (root, `make node images` done).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "tests"))

from fakedra import FAKE_GPU_CLASS  # noqa: E402
from ports import free_port  # noqa: E402
from progress_support import operator_args  # noqa: E402
from support import TIMED, Cluster, OperatorProcess, chart_identity, fresh_namespace, install_crd  # noqa: E402


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The times the tests measured (gang binding, Kueue admission, e2e jobs), in CI's log too."""
    if TIMED:
        terminalreporter.section("measured")
        for line in TIMED:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def place(item: pytest.Item) -> int:
        return 2 if item.get_closest_marker("after_all") else 1 if item.get_closest_marker("late") else 0

    items.sort(key=place)  # stable: the rest keep their order


def want_real_node() -> bool:
    setting = os.environ.get("DISTTRAIN_REAL_NODE", "auto")
    if setting in ("0", "1"):
        return setting == "1"
    import realnode

    return os.geteuid() == 0 and realnode.ready_to_run()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    existing = os.environ.get("DISTTRAIN_TEST_KUBECONFIG")
    if existing:
        yield Cluster(kubeconfig=Path(existing))
        return
    from localcluster import LocalCluster

    # Each lane of `make test` (hack/testlanes.py) has a plane of its own.
    root = Path(os.environ.get("DISTTRAIN_TEST_CLUSTER_DIR") or ROOT / ".cache" / "test-cluster")
    (root / "audit.log").unlink(missing_ok=True)  # this session's requests only
    # Every ServiceAccount's requests are audited: the operator's, as the chart's account, are
    # compared with what the chart grants at the end (tests/integration/test_rbac_audit.py).
    # Without the gang schedulers where no test of the session uses them (the e2e lane): Volcano's
    # scheduler alone runs a session every second, CPU the other lane's tests wait on.
    gang = os.environ.get("DISTTRAIN_TEST_GANG_SCHEDULERS", "1") != "0"
    with LocalCluster(root=root, real_node=want_real_node(), audit_groups=("system:serviceaccounts",),
                      gang_schedulers=gang) as local:
        yield Cluster(kubeconfig=local.kubeconfig, local=local)


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> Cluster:
    install_crd(cluster)
    return cluster


@pytest.fixture(scope="session")
def operator(crd: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    # DISTTRAIN_OPERATOR_VERBOSE=1: the operator's debug log (every create and delete it makes).
    verbose = ("--verbose",) if os.environ.get("DISTTRAIN_OPERATOR_VERBOSE") else ()
    tmp = tmp_path_factory.mktemp("operator")
    # Serving progress reports as the chart's operator does (tests/integration/test_progress_reports.py).
    progress = operator_args(free_port())
    # The fake DRA driver's class (tests/integration/test_dra_jobs.py) counts as GPUs, as the chart's
    # dra.gpuDeviceClasses would say.
    dra = (f"--gpu-device-class={FAKE_GPU_CLASS}",)
    proc = OperatorProcess(chart_identity(crd, tmp), tmp / "operator.log", (*progress, *dra, *verbose))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster) as name:
        yield name
