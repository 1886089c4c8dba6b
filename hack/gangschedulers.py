"""The gang schedulers beside the local plane's default scheduler (which does Kubernetes' own gang
scheduling once its GenericWorkload and GangScheduling gates are on: localcluster.py turns them on).

- scheduler-plugins: a kube-scheduler with the Coscheduling plugin, profile
  `scheduler-plugins-scheduler` (the name its Helm chart gives it), and its controller, which keeps
  the scheduling.x-k8s.io PodGroups' status;
- Volcano: vc-scheduler with its default configuration (actions enqueue, allocate, backfill; the
  gang plugin). It makes its `default` queue itself; the queue controller that would open it is
  replaced by one status patch here (the proportion plugin schedules only from Open queues).

Their CRDs come from their own modules (hack/build-binaries.sh copies them to .cache/bin/crds).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import yaml

from crdserved import served
from ports import free_port

SP_SCHEDULER = "scheduler-plugins-scheduler"
# Volcano's own default, written out (with no file it also reads an empty one and logs an error).
VOLCANO_CONFIG = """actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
"""
VOLCANO_DEFAULT_QUEUE = "default"


class Plane(Protocol):
    root: Path

    @property
    def kubeconfig(self) -> Path: ...

    def spawn(self, name: str, argv: list[str]) -> None: ...
    def wait(self, what: str, ready: Callable[[], object], deadline: float, interval: float = 0.2) -> None: ...
    def api(self, method: str, path: str, body: Any = None, *, allow_missing: bool = False,
            content_type: str = "application/json") -> Any: ...


def available(bin_dir: Path) -> bool:
    return all((bin_dir / b).exists() for b in ("coscheduler", "coscheduling-controller", "vc-scheduler")) and \
        (bin_dir / "crds" / "volcano").is_dir()


def start(plane: Plane, bin_dir: Path, deadline: float) -> None:
    install_crds(plane, [bin_dir / "crds" / "scheduler-plugins", bin_dir / "crds" / "volcano"], deadline)
    config = plane.root / "coscheduler.yaml"
    config.write_text(json.dumps({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(plane.kubeconfig), "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SP_SCHEDULER, "plugins": {
            "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
            "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]}},
            "pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 60}}]}],
    }))
    # Coscheduling wakes a rejected gang only on a Pod *added* or a PodGroup changed; GPUs freed by
    # a finished job don't, and kube-scheduler's flush of unschedulable pods comes every 5 minutes
    # by default. On a busy cluster pods come and go all the time; here, 10 s.
    plane.spawn("coscheduler", [str(bin_dir / "coscheduler"), f"--config={config}", "--secure-port=0",
                                "--pod-max-in-unschedulable-pods-duration=10s", "--v=1"])
    plane.spawn("coscheduling-controller", [str(bin_dir / "coscheduling-controller"),
                                            f"--kubeconfig={plane.kubeconfig}", "--metricsAddr=0", "--probeAddr=0"])
    volcano_config = plane.root / "volcano-scheduler.conf"
    volcano_config.write_text(VOLCANO_CONFIG)
    plane.spawn("vc-scheduler", [str(bin_dir / "vc-scheduler"), f"--kubeconfig={plane.kubeconfig}",
                                 f"--scheduler-conf={volcano_config}", "--leader-elect=false", "--schedule-period=1s",
                                 f"--listen-address=127.0.0.1:{free_port()}", "-v=1"])
    open_volcano_queue(plane, deadline)


def install_crds(plane: Plane, folders: list[Path], deadline: float) -> None:
    """Create every CustomResourceDefinition in `folders` and wait until each is served (crdserved.py)."""
    crds = []
    for path in sorted(p for folder in folders for p in folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                plane.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
                crds.append(doc)
    for crd in crds:
        plane.wait(f"CRD {crd['metadata']['name']} served",
                   functools.partial(served, functools.partial(plane.api, "GET"), crd), deadline, 0.1)


def open_volcano_queue(plane: Plane, deadline: float) -> None:
    """What Volcano's queue controller does for a new queue: mark it Open."""
    path = f"/apis/scheduling.volcano.sh/v1beta1/queues/{VOLCANO_DEFAULT_QUEUE}"
    plane.wait("vc-scheduler's default queue", lambda: plane.api("GET", path, allow_missing=True), deadline)
    plane.api("PATCH", f"{path}/status", {"status": {"state": "Open"}}, content_type="application/merge-patch+json")
