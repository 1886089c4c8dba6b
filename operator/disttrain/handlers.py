"""kopf wiring, kept thin: index jobs and pods, queue a job on any event of it or its pods,
and let the Controller reconcile. No change-detecting handlers: kopf then writes nothing to
our objects (no progress or last-handled annotations), so every API write is the operator's."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from disttrain import metrics
from disttrain.constants import GROUP, JOB_NAME_LABEL, KIND, PLURAL, VERSION
from disttrain.controller import Controller, JobKey
from disttrain.kube import Kube, new_api_client
from disttrain.objects import controller_of
from disttrain.observed import ObservedPod, observe_pod
from disttrain.queueing import ObservedWorkload, observe_workload
from disttrain.tombstones import RESYNC_SECONDS


def controlled_by_its_job(body: kopf.Body, **_: Any) -> bool:
    """A pod controlled by a DistTrainJob of the name its job-name label gives: this job's, or an
    earlier one's of the same name (told apart by UID when reconciling)."""
    ref = controller_of(body.get("metadata") or {})
    return (ref is not None and ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP)
            and ref.get("name") == (body.get("metadata", {}).get("labels") or {}).get(JOB_NAME_LABEL))


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
    settings.scanning.disabled = bool(memo.get("exact_namespaces"))
    controller = Controller(Kube(await new_api_client()), workers=int(memo.get("workers", 16)),
                            resync_seconds=float(memo.get("resync_seconds", RESYNC_SECONDS)))
    controller.start()
    memo["controller"] = controller


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        await controller.stop()


# The indexers are async: kopf runs a sync handler in a thread pool (a thread hop, a context copy
# and a shielded future per event: 18% of the operator's CPU in a burst, profiled); an async one
# runs inline on the loop.
@kopf.index(GROUP, VERSION, PLURAL)
async def jobs_by_key(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[JobKey, dict[str, Any]]:
    # A plain copy: kopf's Body is a live view of the latest event.
    return {(namespace, name): {"metadata": dict(body.metadata), "spec": dict(body.spec),
                                "status": dict(body.status)}}


@kopf.index("", "v1", "pods", labels={JOB_NAME_LABEL: kopf.PRESENT}, when=controlled_by_its_job)
async def pods_by_job(namespace: str, labels: Mapping[str, str], body: kopf.Body,
                      **_: Any) -> dict[JobKey, ObservedPod]:
    return {(namespace, labels[JOB_NAME_LABEL]): observe_pod(body)}


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
    controller.bind(indexes["jobs_by_key"], indexes["pods_by_job"], indexes["workloads_by_job"])
    controller.queue.add(key)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(namespace: str, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    metrics.JOB_GAUGES.observe(kwargs.get("type"), kwargs["body"])  # DELETED removes the job's series
    _queue(memo, (namespace, name), kwargs)


@kopf.on.event("", "v1", "pods", labels={JOB_NAME_LABEL: kopf.PRESENT}, when=controlled_by_its_job)
async def pod_event(namespace: str, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any) -> None:
    if kwargs.get("type") == "DELETED":  # its final state may say why it went (tombstones.py)
        memo["controller"].tombstones.pod_deleted((namespace, labels[JOB_NAME_LABEL]), observe_pod(kwargs["body"]))
    _queue(memo, (namespace, labels[JOB_NAME_LABEL]), kwargs)


@kopf.on.event(*KUEUE, labels={JOB_NAME_LABEL: kopf.PRESENT})
async def workload_event(namespace: str, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any) -> None:
    _queue(memo, (namespace, labels[JOB_NAME_LABEL]), kwargs)
