"""The impure half of reconciling: read a job and its pods from the in-memory indexes, call the
pure `reconcile`, and carry out its plan through the API.

The indexes lag the API server by a watch event: `Expectations` cover that gap. A status
computed from a stale job is refused by the API server (resourceVersion precondition) and
reconciled again from the newer one. Every child is trusted only when its controller reference
carries the job's UID: a name already taken by an earlier job's object is waited out (garbage
collection is removing it), by anything else it fails the job with a message naming the object.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import SpecError, parse_spec
from disttrain.api.progress import Role, reporter_role
from disttrain.api.status import Phase, enter_phase, timestamp
from disttrain.apiserver.kube import Conflict, NamespaceTerminating
from disttrain.apiserver.kube_api import KubeAPI
from disttrain.apiserver.retries import Explained
from disttrain.builders import mpi
from disttrain.builders.progress import ProgressEndpoint
from disttrain.control.children import Children
from disttrain.control.claims import Claims
from disttrain.control.expectations import Expectations
from disttrain.control.groups import Groups
from disttrain.control.progress_book import ProgressBook
from disttrain.control.queues import WORKLOADS_UNLISTED_RETRY, Queues
from disttrain.control.ssh_keys import generate_ssh_keys
from disttrain.control.status_writes import REPORTED_PROGRESS_INTERVAL, StatusWriter
from disttrain.control.teardown import Namespaces
from disttrain.control.telling import Telling
from disttrain.control.tombstones import RESYNC_SECONDS, Tombstones, resync_forever
from disttrain.control.workqueue import WorkQueue
from disttrain.decide import create_refusals, dispatch_steps
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Event, Plan
from disttrain.decide.queueing import ObservedWorkload
from disttrain.decide.reasons import REFUSED, Reason
from disttrain.decide.reconcile import reconcile
from disttrain.runtime import metrics
from disttrain.runtime.clock import Clock, SystemClock

log = logging.getLogger(__name__)
JobKey = tuple[str, str]  # (namespace, name)
# The watches' indexes (watch/): a job's key -> its body (one), its pods, its Workloads.
JobIndex = Mapping[JobKey, Iterable[Mapping[str, Any]]]
PodIndex = Mapping[JobKey, Iterable[ObservedPod]]
WorkloadIndex = Mapping[JobKey, Iterable[ObservedWorkload]]
# How soon to look again at a name an earlier job's object holds (garbage collection: seconds).
RETRY_TAKEN_NAME_SECONDS = 1.0


class Controller:
    # Pod creates in flight at once, all jobs together: 16 workers' 5-pod jobs (the plain
    # client's own concurrency in `make bench`). At 32, per-job p50 in the burst was 4.6 s where
    # the plain client's was 3.3; at 80, 4.1 and 3.8 (issue 25).
    def __init__(self, kube: KubeAPI, workers: int = 16, create_concurrency: int = 80,
                 clock: Clock | None = None, resync_seconds: float = RESYNC_SECONDS,
                 report_to: ProgressEndpoint | None = None, progress_interval: float = REPORTED_PROGRESS_INTERVAL,
                 name_reuse_seconds: float = 0.0, gpu_device_classes: Sequence[str] = ()) -> None:
        self.kube, self.resync_seconds = kube, resync_seconds
        self.name_reuse_seconds = name_reuse_seconds  # decide/name_reuse_steps.py
        self.clock: Clock = clock or SystemClock()
        self.queue: WorkQueue[JobKey] = WorkQueue(self.reconcile_key, workers=workers, on_failure=self._retrying)
        self.expectations: dict[JobKey, Expectations] = {}
        self.ssh_keys: dict[str, mpi.SSHKeys] = {}  # per MPI job uid
        self.uids: dict[JobKey, str] = {}
        self.statuses = StatusWriter(kube, self.clock, progress_interval, self.queue.backlog, workers)
        self.report_to = report_to  # where the pods report training progress to (endpoint/server.py)
        self.progress = ProgressBook(wake=lambda key: self.queue.add_after(key, self.statuses.progress_due(key)),
                                     wake_now=self.queue.add,
                                     awaits_checkpoint=lambda key: self.statuses.awaits_checkpoint(key, self._jobs))
        self.refusals: dict[JobKey, create_refusals.Refusal] = {}
        self.telling = Telling(kube, self.clock)
        self.groups = Groups(kube, self.clock)
        self.claims = Claims(kube, self.clock, gpu_device_classes)
        self.queues = Queues(kube, self.clock)
        self.namespaces = Namespaces(kube, self.clock)
        self.children = Children(kube, self.groups, create_concurrency)
        self._jobs: JobIndex = {}
        self._pods: PodIndex = {}
        self._workloads: WorkloadIndex = {}
        self.tombstones = Tombstones(lambda: self.clock.now().timestamp())
        self._resyncs: asyncio.Task[None] | None = None

    def bind(self, jobs: JobIndex | None = None, pods: PodIndex | None = None,
             workloads: WorkloadIndex | None = None, workloads_listed: Callable[[], bool] | None = None) -> None:
        """The indexes reconciling reads (watch/), and whether the Workloads have listed (queues.py)."""
        self._jobs = self._jobs if jobs is None else jobs
        self._pods = self._pods if pods is None else pods
        self._workloads = self._workloads if workloads is None else workloads
        self.queues.listed = self.queues.listed if workloads_listed is None else workloads_listed

    def start(self) -> None:
        self.queue.start()
        self._resyncs = asyncio.create_task(resync_forever(self.resync, self.resync_seconds), name="resync")

    async def stop(self) -> None:
        if self._resyncs is not None:
            self._resyncs.cancel()
            await asyncio.gather(self._resyncs, return_exceptions=True)
        await self.queue.stop()
        await self.kube.close()

    async def reconcile_key(self, key: JobKey) -> float | None:
        body = next(iter(self._jobs.get(key, ())), None)
        if body is None:
            self._forget(key)
            return None
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None
        # Decoded once for the pass (the index holds it as JSON: watch/job_events.py, HeldJob).
        body = self.statuses.view(key, dict(body))
        ref = JobRef(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        if self.uids.get(key) not in (None, ref.uid):
            self._forget(key)  # deleted and made again under the same name
        self.uids[key] = ref.uid
        try:
            spec = parse_spec(body.get("spec") or {})
        except SpecError as err:
            return await self._fail(key, ref, body.get("status"), meta.get("resourceVersion"),
                                    Reason.INVALID_SPEC, str(err))
        started = self.clock.monotonic()
        job = JobState(ref=ref, generation=int(meta.get("generation") or 0), spec=spec,
                       status=(status := dict(body.get("status") or {})), progress=self.progress.state(key, ref.uid),
                       report_to=self.report_to, name_reuse_seconds=self.name_reuse_seconds,
                       departed=self.tombstones.departed_of(key, status))
        keys = None
        if spec.mpi is not None and not spec.mpi.gloo and not dispatch_steps.managed_elsewhere(spec):
            # Kept while the job lives: its Secret is made once, but a plan that creates pods
            # always carries the supporting objects (created only if we haven't yet).
            if ref.uid not in self.ssh_keys:
                self.ssh_keys[ref.uid] = generate_ssh_keys(f"disttrain/{ref.namespace}/{ref.name}")
            keys = self.ssh_keys[ref.uid]
        if self.queues.waiting_for_workloads(meta):
            return WORKLOADS_UNLISTED_RETRY
        job = await self.groups.observe(job)
        job = await self.claims.observe(job, self._pods.get(key, ()))
        job = await self.queues.observe(job, meta.get("labels") or {}, meta.get("annotations") or {},
                                        self._workloads.get(key, ()))
        pods = self._observed_pods(key, ref, job.status.get("deletedPods") or ())
        plan = reconcile(job, pods, self.clock.now(), keys)
        plan = create_refusals.hold(self.refusals.get(key), Queues.hold_unreadable(job, plan), self.clock.monotonic())
        try:
            if await self.namespaces.going_away(ref, plan, body.get("status") or {}, self._pods.get(key, ()),
                                               set(self._expectations(key, ref).deleted)):
                return None  # the namespace controller is deleting it all: nothing to write (teardown.py)
            return await self._apply(key, ref, spec.framework.value, body, plan)
        except NamespaceTerminating:
            self.namespaces.mark(ref.namespace)
            return None
        finally:
            metrics.RECONCILE_SECONDS.observe(self.clock.monotonic() - started)

    def _forget(self, key: JobKey) -> None:
        """The job is gone: drop everything remembered for it."""
        for memory in (self.expectations, self.refusals):
            memory.pop(key, None)
        for forget in (self.statuses.forget, self.progress.forget, self.telling.forget, self.tombstones.forget,
                       self.queue.forget):
            forget(key)
        uid = self.uids.pop(key, None)
        if uid is not None:
            self.children.forget(uid)
            self.ssh_keys.pop(uid, None)
            self.groups.forget(uid)
            self.claims.forget(uid)

    def role_of(self, key: JobKey, pod: ObservedPod) -> Role | None:
        """What `pod` may report for its job (api/progress.py), from the job as indexed."""
        body = next(iter(self._jobs.get(key, ())), None)
        if body is None or body["metadata"].get("uid") != pod.owner_uid:
            return None
        try:
            return reporter_role(parse_spec(body.get("spec") or {}), pod.replica_type, pod.index)
        except SpecError:
            return None

    def _expectations(self, key: JobKey, ref: JobRef) -> Expectations:
        exp = self.expectations.get(key)
        if exp is None or exp.owner_uid != ref.uid:
            exp = self.expectations[key] = Expectations(self.clock, ref.uid)
        return exp

    def _observed_pods(self, key: JobKey, ref: JobRef, judged: Iterable[str] = ()) -> list[ObservedPod]:
        return self._expectations(key, ref).apply(self.tombstones.view(key, self._pods.get(key, ()), set(judged)))

    async def resync(self) -> set[JobKey]:
        """Purge pods the watch never saw go (tombstones.py); their jobs are reconciled again."""
        for key in (touched := await self.tombstones.resync(self.kube, self._pods)):
            self.queue.add(key)
        return touched

    async def _apply(self, key: JobKey, ref: JobRef, framework: str, body: Mapping[str, Any],
                     plan: Plan) -> float | None:
        if not await self.statuses.write_plan(key, ref, body, plan):
            return 1.0  # someone else wrote the job meanwhile: its event re-queues it (the timer: a safety net)
        # The transitions just written are told whatever stops this pass below (a delete refused,
        # Kueue's Conflict): they happened. Told while the pass goes on, not before it: one round
        # trip less per job (`make bench`, burst per-job latency), and the pass ends only once told.
        telling = asyncio.ensure_future(self.telling.tell(ref, plan.events))
        try:
            return await self._act(key, ref, framework, body, plan)
        finally:
            await telling

    async def _act(self, key: JobKey, ref: JobRef, framework: str, body: Mapping[str, Any],
                   plan: Plan) -> float | None:
        exp = self._expectations(key, ref)
        await self._delete_pods(ref, exp, plan.delete)
        try:
            await self.queues.write(ref, plan.workload)
        except Conflict:
            return 1.0  # Kueue wrote the Workload meanwhile: again, from its newer state
        if await self.groups.release(ref, plan.delete_objects):
            self.children.supported.discard(ref.uid)  # made afresh with the next pods
        failure, wait = await self.children.create_all(exp, ref, framework, plan.create, plan.restore)
        for obj in plan.keep_current:
            await self.children.keep_current(ref, obj, plan.remount)
        await self.children.annotate(ref, plan.annotate)
        if failure is not None and failure[0] in REFUSED:
            return await self._refused(key, ref, body, plan, *failure)
        if failure is None and create_refusals.passed(self.refusals.get(key), plan):
            self.refusals.pop(key, None)
        if failure is not None:
            # On top of the status just written, so start time, counts and conditions stay.
            return await self._fail(key, ref, plan.status, self.statuses.last_version(key, plan.status, body),
                                    *failure)
        if plan.delete_job:
            log.info("deleting %s/%s: ttlSecondsAfterFinished has passed", ref.namespace, ref.name)
            await self.kube.delete_job(ref.namespace, ref.name, ref.uid)
            return None
        if wait:
            plan.requeue_within(RETRY_TAKEN_NAME_SECONDS)
        return plan.requeue_after

    async def _delete_pods(self, ref: JobRef, exp: Expectations, pods: list[ObservedPod]) -> None:
        """Delete `pods` by uid, each expected gone until its deletion shows. A failed delete (429, 500, a timeout)
        is expected no more and raised: the work queue's retry deletes it again (the status's deletedPods keeps its
        failure counted once)."""
        pods = [p for p in pods if p.uid]  # a create still in flight: deleted once it answers
        for pod in pods:
            exp.expect_deleted(pod.uid)
        results = await asyncio.gather(*(self.kube.delete_pod(ref.namespace, p.name, p.uid) for p in pods),
                                       return_exceptions=True)
        failed = [(pod, err) for pod, err in zip(pods, results, strict=True) if isinstance(err, BaseException)]
        for pod, _ in failed:
            exp.not_deleted(pod.uid)
        metrics.PODS_DELETED.inc(len(pods) - len(failed))
        if failed:
            raise failed[0][1]

    async def _refused(self, key: JobKey, ref: JobRef, body: Mapping[str, Any], plan: Plan, reason: Reason,
                       message: str) -> float:
        """A create was refused by something that may change: the job says so and waits (create_refusals.py)."""
        previous = self.refusals.get(key)
        refusal = self.refusals[key] = create_refusals.refused(previous, reason, message, self.clock.monotonic())
        if previous is None or previous.message != message:
            log.warning("%s/%s: %s (retrying in %.0fs)", ref.namespace, ref.name, message, refusal.backoff)
            await self._event(ref, Event("Warning", reason, message))
        last = self.statuses.written.get(key)
        written_before = dict(last.status) if last is not None else None  # plan.status itself, if just written
        create_refusals.say_why(plan, refusal)
        if written_before == plan.status:
            return refusal.backoff
        before = last.after if last is not None else body["metadata"].get("resourceVersion")
        was = written_before if written_before is not None else body.get("status")
        return refusal.backoff if await self.statuses.write(key, ref, plan.status, before, was) else 1.0

    async def _fail(self, key: JobKey, ref: JobRef, status: Mapping[str, Any] | None, version: str | None,
                    reason: Reason, message: str) -> float | None:
        """A job only the operator can see is wrong: phase Failed, the message, a Warning event. A finished job's
        verdict stands (Succeeded is never turned Failed, a first failure's time and words are kept); the write is
        made over the resourceVersion the verdict was drawn from, and a job changed meanwhile is looked at again."""
        current = dict(status or {})
        if current.get("phase") in (Phase.SUCCEEDED.value, Phase.FAILED.value):
            return None
        now = timestamp(self.clock.now())
        new = enter_phase(current, Phase.FAILED, reason, message, now)
        new["completionTime"] = current.get("completionTime") or now
        if not await self.statuses.write(key, ref, new, version, current, remember=False):
            return 1.0
        await self._event(ref, Event("Warning", reason, message))
        metrics.count_transition(reason)
        return None

    async def _retrying(self, key: JobKey, failure: Explained) -> None:
        uid = self.uids.get(key)
        if uid is not None:
            await self.telling.retrying(JobRef(name=key[1], namespace=key[0], uid=uid), failure)

    async def _event(self, ref: JobRef, event: Event) -> None:
        await self.telling.event(ref, event)
