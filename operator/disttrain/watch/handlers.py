"""kopf wiring, kept thin: log in, start the watches and the Controller, and stop them. Jobs, pods
and Kueue's Workloads come through our own watches (jobwatch.py, podwatch.py, workloadwatch.py),
not kopf's: kopf follows no resource, and writes nothing to our objects (no progress or
last-handled annotations), so every API write is the operator's."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import kopf

from disttrain.apiserver import credentials
from disttrain.apiserver.kube import Kube
from disttrain.apiserver.rest import Rest
from disttrain.builders.progress import EndpointPods, ProgressEndpoint
from disttrain.control.controller import Controller
from disttrain.control.progress_desk import ProgressDesk
from disttrain.control.status_writes import REPORTED_PROGRESS_INTERVAL
from disttrain.control.tombstones import RESYNC_SECONDS
from disttrain.runtime import metrics, serving_cert
from disttrain.runtime.health import BEAT_SECONDS, Health
from disttrain.runtime.memory import trim_when_quiet
from disttrain.watch.jobwatch import JobWatch
from disttrain.watch.podwatch import POD_EVENTS_WITHIN, PodWatch
from disttrain.watch.progress_supervisor import EndpointProcess
from disttrain.watch.workloadwatch import WorkloadWatch


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


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    # kopf follows no resource of its own (the watches below are ours): no scan of namespaces or
    # resources, so no request the namespaced chart's Roles refuse.
    settings.scanning.disabled = True
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
    # The watches hold a connection each for as long as they run (three in each namespace given by
    # name): a pool of their own, so that the writes' 64 are never theirs.
    watching = memo["watching"] = Rest(credentials.login, max_connections=0)
    namespaces = memo.get("namespaces") or ()
    pods = PodWatch(watching, namespaces, changed=controller.queue.add, deleted=controller.tombstones.pod_deleted,
                    coming_up=lambda key: controller.queue.add_soon(key, POD_EVENTS_WITHIN))
    # DELETED removes the job's series from the gauges.
    jobs = JobWatch(watching, namespaces, changed=controller.queue.add, observed=metrics.JOB_GAUGES.observe)
    workloads = WorkloadWatch(watching, namespaces, changed=controller.queue.add)
    controller.bind(jobs=jobs.view, pods=pods.view, workloads=workloads.view,
                    workloads_listed=workloads.synced.is_set)
    memo["controller"] = controller
    memo["tasks"] = [asyncio.create_task(pods.run(), name="pod watch"),
                     asyncio.create_task(jobs.run(), name="job watch"),
                     asyncio.create_task(workloads.run(), name="workload watch"),
                     asyncio.create_task(trim_when_quiet(lambda: controller.queue.handled), name="trim")]
    if (health := memo.get("health")) is not None:
        memo["tasks"].append(asyncio.create_task(beat(health), name="health"))
    if progress and cert:
        endpoint = memo["progress_endpoint"] = EndpointProcess(
            progress.port, ProgressDesk(pods, controller.progress, controller.role_of),
            lambda: serving_cert.ensure(kube, *progress.secret, progress.hosts), memory_mib=progress.memory_mib,
            cert=cert,  # made just above: the endpoint's first needs no second read of the Secret
            prefork=memo.get("endpoint_prefork"))
        endpoint.start()
    # No job is reconciled before its pods are known: against an empty index it would make them again.
    # Nor before the jobs are: a job its pods' events queued would be forgotten, then listed again.
    # A queued job waits for the Workloads too (workloadwatch.py), and only it: Kueue's API refused
    # (a Role without it, its webhook down) holds no other job.
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
    watching: Rest | None = memo.get("watching")
    if watching is not None:
        await watching.close()
