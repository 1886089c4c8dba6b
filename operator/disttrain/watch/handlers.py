"""kopf wiring, kept thin: index jobs and Kueue's Workloads, queue a job on any event of it, and
let the Controller reconcile. Pods come through our own watch (podwatch.py), not kopf's. No
change-detecting handlers: kopf then writes nothing to our objects (no progress or last-handled
annotations), so every API write is the operator's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
import msgspec

from disttrain.api.constants import GROUP, JOB_NAME_LABEL, PLURAL, VERSION
from disttrain.apiserver import credentials
from disttrain.apiserver.kube import Kube
from disttrain.apiserver.rest import Rest
from disttrain.builders.progress import EndpointPods, ProgressEndpoint
from disttrain.control.controller import Controller, JobKey
from disttrain.control.progress_desk import ProgressDesk
from disttrain.control.status_writes import REPORTED_PROGRESS_INTERVAL
from disttrain.control.tombstones import RESYNC_SECONDS
from disttrain.decide.queueing import ObservedWorkload, observe_workload
from disttrain.runtime import metrics, serving_cert
from disttrain.runtime.health import BEAT_SECONDS, Health
from disttrain.runtime.memory import trim_when_quiet
from disttrain.watch.podwatch import PodWatch, exact_names
from disttrain.watch.progress_supervisor import EndpointProcess


@dataclass(frozen=True)
class ProgressSettings:
    """`disttrain run --progress-port`: where the progress endpoint listens and what pods are told."""

    port: int
    url: str  # as the pods reach it
    secret: tuple[str, str]  # namespace, name: its CA and serving certificate
    hosts: tuple[str, ...]  # what the certificate names
    status_seconds: float  # a job's reported progress is written at most once in this long
    memory_mib: int = 384  # the endpoint's process's memory bound
    pods: EndpointPods | None = None  # the pods serving it (the chart's), for the jobs' NetworkPolicies
    hook_image: str | None = None  # --hook-image: the init container's image that brings the hook


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's own login, registered as ours: without a handler kopf logs in through the Kubernetes
    client library (credentials.py says why we don't load it)."""
    return credentials.login()


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff-base: we register no change-detecting handler, yet kopf builds one (a deep copy of
    the body) for every event and diffs it with the last. Profiled in `make bench --profile`: 8% of
    the operator's CPU in a burst, for nothing."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> Any:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.networking.request_timeout = 60
    # The CRD is there (wait_for_crd, before kopf starts) and the namespaces are given by name:
    # no scan of namespaces or resources, so no request the namespaced chart's Roles refuse.
    settings.scanning.disabled = exact_names(memo.get("namespaces") or ())
    rest = Rest(credentials.login)
    kube = Kube(rest)
    progress: ProgressSettings | None = memo.get("progress")
    cert = await serving_cert.ensure(kube, *progress.secret, progress.hosts) if progress else None
    report_to = ProgressEndpoint(progress.url, cert.ca.decode(), progress.pods, progress.hook_image) \
        if progress and cert else None
    controller = Controller(kube, workers=int(memo.get("workers", 16)),
                            resync_seconds=float(memo.get("resync_seconds", RESYNC_SECONDS)), report_to=report_to,
                            progress_interval=progress.status_seconds if progress else REPORTED_PROGRESS_INTERVAL,
                            name_reuse_seconds=float(memo.get("name_reuse_seconds", 0.0)),
                            gpu_device_classes=list(memo.get("gpu_device_classes") or ()))
    pods = PodWatch(rest, memo.get("namespaces") or (), changed=controller.queue.add,
                    deleted=controller.tombstones.pod_deleted)
    controller.bind(pods=pods.view)
    memo["controller"] = controller
    memo["tasks"] = [asyncio.create_task(pods.run(), name="pod watch"),
                     asyncio.create_task(trim_when_quiet(lambda: controller.queue.handled), name="trim")]
    if (health := memo.get("health")) is not None:
        memo["tasks"].append(asyncio.create_task(beat(health), name="health"))
    if progress and cert:
        endpoint = memo["progress_endpoint"] = EndpointProcess(
            progress.port, ProgressDesk(pods, controller.progress, controller.role_of),
            lambda: serving_cert.ensure(kube, *progress.secret, progress.hosts), memory_mib=progress.memory_mib,
            cert=cert,  # made just above: the endpoint's first needs no second read of the Secret
            forks=memo.get("endpoint_forks"))
        endpoint.start()
    # No job is reconciled before its pods are known: against an empty index it would make them again.
    await pods.synced.wait()
    controller.start()


async def beat(health: Health) -> None:
    """The event loop runs: what /healthz and /readyz read (runtime/health.py)."""
    while True:
        health.beat()
        await asyncio.sleep(BEAT_SECONDS)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    endpoint: EndpointProcess | None = memo.get("progress_endpoint")
    if endpoint is not None:
        await endpoint.stop()
    tasks: list[asyncio.Task[None]] = memo.get("tasks") or []
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        await controller.stop()


# The indexers are async: kopf runs a sync handler in a thread pool (a thread hop, a context copy
# and a shielded future per event: 18% of the operator's CPU in a burst, profiled); an async one
# runs inline on the loop.
@kopf.index(GROUP, VERSION, PLURAL)
async def jobs_by_key(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[JobKey, HeldJob]:
    return {(namespace, name): HeldJob(body)}


class HeldJob(Mapping[str, Any]):
    """A job as the index holds it (a copy: kopf's Body is a live view of the latest event). Its
    spec and status are kept as compact JSON and decoded when read: a pass reads each once (tens
    of microseconds), and a decoded job is ~10 KB of Python objects where its JSON is ~1 KB
    (`make bench`: memory per pod held, issue 25)."""

    __slots__ = ("_spec", "_status", "metadata")

    def __init__(self, body: kopf.Body) -> None:
        self.metadata = held_metadata(body.metadata)
        self._spec = msgspec.json.encode(dict(body.spec))
        self._status = msgspec.json.encode(dict(body.status))

    def __getitem__(self, key: str) -> Any:
        if key == "metadata":
            return self.metadata
        if key in ("spec", "status"):
            return msgspec.json.decode(self._spec if key == "spec" else self._status)
        raise KeyError(key)

    def __eq__(self, other: object) -> bool:
        """Compared as held, undecoded: kopf compares an index's old value with its new on every
        event, and Mapping's own == decodes both (profiled: 1% of a burst's CPU)."""
        if not isinstance(other, HeldJob):
            return NotImplemented
        return (self.metadata, self._spec, self._status) == (other.metadata, other._spec, other._status)

    __hash__ = None  # type: ignore[assignment]  # mutable metadata, as a dict's

    def __iter__(self) -> Iterator[str]:
        return iter(("metadata", "spec", "status"))

    def __len__(self) -> int:
        return 3


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def held_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A job's metadata as the index holds it: without managedFields and kubectl's copy of the
    manifest, which reconciling never reads; they were 45% of a held job's memory (7.8 of 17.5 KB
    for `make bench`'s job, measured with sys.getsizeof over the decoded body)."""
    held = {k: v for k, v in meta.items() if k != "managedFields"}
    if LAST_APPLIED in (held.get("annotations") or {}):
        held["annotations"] = {k: v for k, v in held["annotations"].items() if k != LAST_APPLIED}
    return held


# Kueue's Workloads of queued jobs (queueing.py). kopf watches the resource only once a cluster
# serves it: without Kueue this costs nothing.
KUEUE = ("kueue.x-k8s.io", "v1beta2", "workloads")


@kopf.index(*KUEUE, labels={JOB_NAME_LABEL: kopf.PRESENT})
async def workloads_by_job(namespace: str, labels: Mapping[str, str], body: kopf.Body,
                     **_: Any) -> dict[JobKey, ObservedWorkload]:
    return {(namespace, labels[JOB_NAME_LABEL]): observe_workload(body)}


def _queue(memo: kopf.Memo, key: JobKey, indexes: Mapping[str, kopf.Index[Any, Any]]) -> None:
    controller: Controller = memo["controller"]
    # kopf hands the indexes to handlers only; the controller reads them when it reconciles.
    controller.bind(indexes["jobs_by_key"], workloads=indexes["workloads_by_job"])
    controller.queue.add(key)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(namespace: str, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    metrics.JOB_GAUGES.observe(kwargs.get("type"), kwargs["body"])  # DELETED removes the job's series
    _queue(memo, (namespace, name), kwargs)


@kopf.on.event(*KUEUE, labels={JOB_NAME_LABEL: kopf.PRESENT})
async def workload_event(namespace: str, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any) -> None:
    _queue(memo, (namespace, labels[JOB_NAME_LABEL]), kwargs)
