"""The impure half of reconciling: read a job and its pods from the in-memory indexes, call
the pure `reconcile`, and carry out its plan through the API.

The indexes (kopf's) lag the API server by a watch event. Two in-memory expectations cover
that gap, as client-go controllers do: pods we created but haven't seen yet count as Pending
(so they aren't created again), and pods we deleted count as terminating until their deletion
shows (so a failure is never handled twice). A status computed from a stale job is refused by
the API server (resourceVersion precondition) and reconciled again from the newer one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from disttrain import metrics, mpi
from disttrain.builders import JobRef, PodKey
from disttrain.constants import REPLICA_INDEX_LABEL, REPLICA_TYPE_LABEL
from disttrain.kube import Conflict, Invalid, Kube
from disttrain.observed import ObservedPod
from disttrain.reconcile import Event, JobState, Plan, reconcile
from disttrain.spec import SpecError, parse_spec
from disttrain.status import Phase, enter_phase, timestamp
from disttrain.workqueue import WorkQueue

log = logging.getLogger(__name__)
JobKey = tuple[str, str]  # (namespace, name)
# kopf's indexes: each key maps to the values its objects contributed (one job body; the pods).
JobIndex = Mapping[JobKey, Iterable[Mapping[str, Any]]]
PodIndex = Mapping[JobKey, Iterable[ObservedPod]]
# How long a created pod may stay unseen before we stop assuming it exists.
CREATE_EXPECTATION_SECONDS = 30.0


@dataclasses.dataclass
class Expectations:
    created: dict[str, tuple[PodKey, float]] = dataclasses.field(default_factory=dict)
    deleted: set[str] = dataclasses.field(default_factory=set)


class Controller:
    def __init__(self, kube: Kube, workers: int = 16, create_concurrency: int = 32) -> None:
        self.kube = kube
        self.queue: WorkQueue[JobKey] = WorkQueue(self.reconcile_key, workers=workers)
        self.expectations: dict[JobKey, Expectations] = {}
        # uids of jobs whose Service (and MPI ConfigMap and Secret) we have made
        self.supported: set[str] = set()
        self.ssh_keys: dict[str, mpi.SSHKeys] = {}  # per MPI job uid
        self.written: dict[tuple[str, str], Any] = {}  # (job uid, object name) -> content last written
        self.uids: dict[JobKey, str] = {}
        self._creates = asyncio.Semaphore(create_concurrency)
        self._jobs: JobIndex = {}
        self._pods: PodIndex = {}

    def bind(self, jobs: JobIndex, pods: PodIndex) -> None:
        self._jobs, self._pods = jobs, pods

    def start(self) -> None:
        self.queue.start()

    async def stop(self) -> None:
        await self.queue.stop()
        await self.kube.close()

    # ---------------------------------------------------------------------------------------

    async def reconcile_key(self, key: JobKey) -> float | None:
        body = next(iter(self._jobs.get(key, ())), None)
        if body is None:
            self._forget(key)
            return None
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None
        ref = JobRef(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        if self.uids.get(key) not in (None, ref.uid):
            self._forget(key)  # deleted and made again under the same name
        self.uids[key] = ref.uid
        status = dict(body.get("status") or {})
        try:
            spec = parse_spec(body.get("spec") or {})
        except SpecError as err:
            await self._fail(ref, body, "InvalidSpec", str(err))
            return None
        started = time.monotonic()
        job = JobState(ref=ref, generation=int(meta.get("generation") or 0), spec=spec, status=status)
        keys = None
        if spec.mpi is not None:
            # Kept while the job lives: its Secret is made once, but a plan that creates pods
            # always carries the supporting objects (created only if we haven't yet).
            if ref.uid not in self.ssh_keys:
                self.ssh_keys[ref.uid] = mpi.generate_ssh_keys(f"disttrain/{ref.namespace}/{ref.name}")
            keys = self.ssh_keys[ref.uid]
        plan = reconcile(job, self._observed_pods(key), datetime.datetime.now(datetime.UTC), keys)
        try:
            return await self._apply(key, ref, spec.framework.value, body, plan)
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    def _forget(self, key: JobKey) -> None:
        """The job is gone: drop everything remembered for it."""
        self.expectations.pop(key, None)
        self.queue.forget(key)
        uid = self.uids.pop(key, None)
        if uid is not None:
            self.supported.discard(uid)
            self.ssh_keys.pop(uid, None)
            self.written = {k: v for k, v in self.written.items() if k[0] != uid}

    def _observed_pods(self, key: JobKey) -> list[ObservedPod]:
        exp = self.expectations.setdefault(key, Expectations())
        observed = list(self._pods.get(key, ()))
        names = {p.name for p in observed}
        exp.deleted &= {p.uid for p in observed}
        pods = [dataclasses.replace(p, terminating=True) if p.uid in exp.deleted else p for p in observed]
        now = time.monotonic()
        for name, (pod_key, when) in list(exp.created.items()):
            if name in names or now - when > CREATE_EXPECTATION_SECONDS:
                del exp.created[name]
            else:
                pods.append(ObservedPod(name=name, uid="", replica_type=pod_key.replica_type, index=pod_key.index,
                                        phase="Pending", ready=False, terminating=False, exit_code=None,
                                        reason=None, container_restarts=0))
        return pods

    async def _apply(
        self, key: JobKey, ref: JobRef, framework: str, body: Mapping[str, Any], plan: Plan
    ) -> float | None:
        meta = body["metadata"]
        if plan.status != (body.get("status") or {}):
            try:
                await self.kube.patch_job_status(ref.namespace, ref.name, plan.status, meta.get("resourceVersion"))
            except Conflict:
                # The index hasn't caught up with our last write (or someone else's): its watch
                # event re-queues the job; the timer is a safety net.
                return 1.0
        exp = self.expectations.setdefault(key, Expectations())
        for pod in plan.delete:
            exp.deleted.add(pod.uid)
        await asyncio.gather(*(self.kube.delete_pod(ref.namespace, p.name, p.uid) for p in plan.delete))
        metrics.PODS_DELETED.inc(len(plan.delete))

        invalid = await self._create_all(key, ref, framework, plan.create)
        for obj in plan.keep_current:
            await self._keep_current(ref, obj)
        for event in plan.events:
            await self._event(ref, event)
            metrics.count_transition(event.reason)
        if invalid is not None:
            # On top of the status just written, so start time, counts and conditions stay.
            await self._fail(ref, {"status": plan.status}, "InvalidPodTemplate", invalid)
            return None
        if plan.delete_job:
            log.info("deleting %s/%s: ttlSecondsAfterFinished has passed", ref.namespace, ref.name)
            await self.kube.delete_job(ref.namespace, ref.name, ref.uid)
            return None
        return plan.requeue_after

    async def _create_all(
        self, key: JobKey, ref: JobRef, framework: str, objects: list[dict[str, Any]]
    ) -> str | None:
        """Create the objects (Service and the like first, then pods, concurrently). Returns the
        message of the first pod the API server found invalid, naming the template it came from."""
        exp = self.expectations.setdefault(key, Expectations())
        pods = [o for o in objects if o["kind"] == "Pod"]
        supporting = [o for o in objects if o["kind"] != "Pod"]
        if supporting and ref.uid not in self.supported:
            for obj in supporting:
                created = await self.kube.create(obj)
                if obj["kind"] == "Service" and created:
                    metrics.JOBS_CREATED.inc()
                if obj["kind"] == "ConfigMap":
                    self.written[(ref.uid, obj["metadata"]["name"])] = obj["data"] if created else None
            self.supported.add(ref.uid)

        async def create_pod(pod: dict[str, Any]) -> str | None:
            labels = pod["metadata"]["labels"]
            pod_key = PodKey(labels[REPLICA_TYPE_LABEL], int(labels[REPLICA_INDEX_LABEL]))
            exp.created[pod["metadata"]["name"]] = (pod_key, time.monotonic())
            async with self._creates:
                try:
                    if await self.kube.create(pod):
                        metrics.PODS_CREATED.inc()
                except Invalid as err:
                    exp.created.pop(pod["metadata"]["name"], None)
                    return f"spec.{framework}.{pod_key.replica_type}.template: {err}"
                except BaseException:
                    exp.created.pop(pod["metadata"]["name"], None)
                    raise
            return None

        results = await asyncio.gather(*(create_pod(p) for p in pods))
        return next((r for r in results if r is not None), None)

    async def _keep_current(self, ref: JobRef, obj: dict[str, Any]) -> None:
        """Write `obj` (a ConfigMap) if its data differs from what we last wrote."""
        memory = (ref.uid, obj["metadata"]["name"])
        if self.written.get(memory) == obj["data"]:
            return
        if await self.kube.replace_config_map_data(obj):
            self.written[memory] = obj["data"]

    async def _fail(self, ref: JobRef, body: Mapping[str, Any] | None, reason: str, message: str) -> None:
        """A job only the operator can see is wrong: phase Failed, the message, a Warning event."""
        current = dict((body or {}).get("status") or {})
        if current.get("phase") == Phase.FAILED.value and current.get("message") == message:
            return
        now = timestamp(datetime.datetime.now(datetime.UTC))
        status = enter_phase(current, Phase.FAILED, reason, message, now)
        status["completionTime"] = now
        await self.kube.patch_job_status(ref.namespace, ref.name, status, None)
        await self._event(ref, Event("Warning", reason, message))
        metrics.count_transition(reason)

    async def _event(self, ref: JobRef, event: Event) -> None:
        try:
            await self.kube.post_event(ref.namespace, ref.name, ref.uid, event.type, event.reason, event.message)
        except Exception:  # an event lost must never stop the job
            log.warning("could not post event %s for %s/%s", event.reason, ref.namespace, ref.name, exc_info=True)

