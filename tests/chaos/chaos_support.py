"""What the chaos scenarios share: the API server's own request counters, a pod watch that records
every pod the API server accepted, and job manifests sized for the KWOK nodes (no GPUs: fifty
jobs must fit on four fake nodes at once)."""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from urllib3.exceptions import HTTPError

from manifests import HOROVOD_IMAGE, job, replica
from support import Cluster

# apiserver_request_total{code="403",component="apiserver",...,resource="pods",...,verb="POST"} 3
_SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
RequestKey = tuple[str, str, str, str]  # (verb, resource, subresource, code)


def request_counts(cluster: Cluster) -> Counter[RequestKey]:
    """The API server's `apiserver_request_total`, by verb, resource, subresource and code. It
    counts every client: a scenario compares two snapshots, and a namespace of its own."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    counts: Counter[RequestKey] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""),
               labels.get("code", ""))
        counts[key] += int(float(match["value"]))
    return counts


def delta(before: Counter[RequestKey], after: Counter[RequestKey]) -> Counter[RequestKey]:
    return Counter({k: after[k] - before[k] for k in after if after[k] - before[k] > 0})


@dataclass(frozen=True)
class SeenPod:
    name: str
    uid: str
    job: str
    owner_uid: str


@dataclass
class PodRecorder:
    """Every pod of a namespace the API server accepted, from a watch that resumes where it left
    off (a pod created and deleted between two events is still an ADDED event we get)."""

    cluster: Cluster
    namespace: str
    seen: dict[str, SeenPod] = field(default_factory=dict)  # uid -> pod
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    error: BaseException | None = None
    outages: list[str] = field(default_factory=list)  # watch errors survived

    def start(self) -> PodRecorder:
        self._api = client.CoreV1Api(self.cluster.api)
        self._list()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _list(self) -> None:
        listed = self._api.list_namespaced_pod(self.namespace)
        for pod in listed.items:
            self._record(pod)
        self._version = listed.metadata.resource_version

    def _record(self, pod: Any) -> None:
        meta = pod.metadata
        owner = next((r.uid for r in meta.owner_references or [] if r.controller), "")
        self.seen.setdefault(meta.uid, SeenPod(meta.name, meta.uid, (meta.labels or {}).get(
            "disttrain.dev/job-name", ""), owner))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._watch()
                except (HTTPError, OSError, client.ApiException) as err:  # the API server down (a scenario's doing)
                    self.outages.append(f"{type(err).__name__} {getattr(err, 'status', '')}")
                    if isinstance(err, client.ApiException) and err.status == 410:
                        # A restarted API server's watch cache starts at its restart: list again.
                        # What this can miss: a pod created and deleted between the restart and
                        # this list, a fraction of a second with the operator reconnecting too.
                        self._list()
                    else:
                        self._stop.wait(0.5)
        except BaseException as err:  # reported by stop(): a recorder that missed events proves nothing
            self.error = err

    def _watch(self) -> None:
        """Resumes from the last version seen: through an API server restart nothing is missed
        (etcd keeps the versions); an expired version (410) would raise and fail the recorder."""
        w = watch.Watch()
        for event in w.stream(self._api.list_namespaced_pod, self.namespace, resource_version=self._version,
                              timeout_seconds=2, allow_watch_bookmarks=True):
            obj = event["object"]
            self._version = obj.metadata.resource_version
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                self._record(obj)
        w.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.error is not None:
            raise AssertionError(f"the pod watch failed: {self.error!r}")

    def creations(self, job_name: str) -> Counter[str]:
        """How many pods of each name the API server accepted for `job_name`."""
        return Counter(p.name for p in self.seen.values() if p.job == job_name)


# -- manifests that fit: no GPUs, a tenth of a CPU -------------------------------------------------


def tf_small(name: str, workers: int = 2, policy: str = "ExitCode", **run_policy: Any) -> dict[str, Any]:
    return job(name, {"tensorflow": {"worker": replica(workers, policy, cpu="100m")}}, run_policy or None)


def tf_ps_small(name: str, **run_policy: Any) -> dict[str, Any]:
    return job(name, {"tensorflow": {"chief": replica(1, cpu="100m"), "ps": replica(1, cpu="100m"),
                                     "worker": replica(2, cpu="100m")}},
               {"restartScope": "Pod", **run_policy})


def mpi_small(name: str, workers: int = 2, **run_policy: Any) -> dict[str, Any]:
    worker = replica(workers, "ExitCode", cpu="100m", image=HOROVOD_IMAGE)
    launcher = replica(1, "Never", cpu="100m", command=["mpirun", "python", "/train.py"], image=HOROVOD_IMAGE)
    return job(name, {"mpi": {"launcher": launcher, "worker": worker}}, run_policy or None)
