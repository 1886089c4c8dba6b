"""kopf wiring, kept thin: log in, start and stop, index Kueue's Workloads and queue a job on any
event of its Workload, and let the Controller reconcile. Jobs and pods come through our own
watches (jobwatch.py, podwatch.py), not kopf's. No change-detecting handlers: kopf then writes
nothing to our objects (no progress or last-handled annotations), so every API write is the
operator's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from disttrain.api.constants import JOB_NAME_LABEL
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
from disttrain.watch.jobwatch import JobWatch
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
    # DELETED removes the job's series from the gauges.
    jobs = JobWatch(rest, memo.get("namespaces") or (), changed=controller.queue.add,
                    observed=metrics.JOB_GAUGES.observe)
    controller.bind(jobs=jobs.view, pods=pods.view)
    memo["controller"] = controller
    memo["tasks"] = [asyncio.create_task(pods.run(), name="pod watch"),
                     asyncio.create_task(jobs.run(), name="job watch"),
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
    # Nor before the jobs are: a job its pods' events queued would be forgotten, then listed again.
    await asyncio.gather(pods.synced.wait(), jobs.synced.wait())
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


# Kueue's Workloads of queued jobs (queueing.py). kopf watches the resource only once a cluster
# serves it: without Kueue this costs nothing.
KUEUE = ("kueue.x-k8s.io", "v1beta2", "workloads")


@kopf.index(*KUEUE, labels={JOB_NAME_LABEL: kopf.PRESENT})
async def workloads_by_job(namespace: str, labels: Mapping[str, str], body: kopf.Body,
                     **_: Any) -> dict[JobKey, ObservedWorkload]:
    return {(namespace, labels[JOB_NAME_LABEL]): observe_workload(body)}


@kopf.on.event(*KUEUE, labels={JOB_NAME_LABEL: kopf.PRESENT})
async def workload_event(namespace: str, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any) -> None:
    controller: Controller = memo["controller"]
    # kopf hands its indexes to handlers only; the controller reads this one when it reconciles.
    controller.bind(workloads=kwargs["workloads_by_job"])
    controller.queue.add((namespace, labels[JOB_NAME_LABEL]))
