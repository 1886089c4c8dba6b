"""Creating a job's children: its supporting objects (Service, ConfigMap, Secret, gang group),
then its pods, concurrently; and keeping its ConfigMap current. Every object found under a name
we wanted is checked for whose it is before it is trusted (objects.ownership)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from disttrain.api.constants import DISCOVERY_ANNOTATION, REPLICA_INDEX_LABEL, REPLICA_TYPE_LABEL
from disttrain.api.objects import JobRef, Ownership, PodKey, not_owned_message, ownership
from disttrain.api.observed import ObservedPod
from disttrain.apiserver.kube import Invalid, NotServed, Refused
from disttrain.control.expectations import Expectations
from disttrain.control.groups import Groups
from disttrain.decide.reasons import Reason
from disttrain.runtime import metrics

# The first batch of a pass's pod creates: a job of up to 8 pods (most jobs: a chief, a few ps and
# workers) in one round trip. A job whose last creates were refused starts from 1 (_create_pods).
FIRST_BATCH = 8


def data_digest(data: Any) -> str:
    """A ConfigMap's data in 16 hex digits: what a pod's discovery annotation says it mounts."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class ChildrenAPI(Protocol):
    async def create(self, obj: dict[str, Any]) -> str | None: ...
    async def get(self, obj: dict[str, Any]) -> dict[str, Any] | None: ...
    async def get_metadata(self, obj: dict[str, Any]) -> dict[str, Any] | None: ...
    async def patch_config_map_data(self, obj: dict[str, Any]) -> bool: ...
    async def annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str]) -> bool: ...


class Children:
    def __init__(self, kube: ChildrenAPI, groups: Groups, create_concurrency: int) -> None:
        self.kube, self.groups = kube, groups
        self.creates = asyncio.Semaphore(create_concurrency)
        self.supported: set[str] = set()  # uids of jobs whose supporting objects exist and are theirs
        self.refused: set[str] = set()  # uids of jobs whose last pod creates were refused
        # (job uid, object name) -> the digest of the data last written: a large MPI job's hostfile and a
        # large TensorFlow job's cluster are up to 1 MiB and 128 KiB, kept here in 16 characters.
        self.written: dict[tuple[str, str], str] = {}
        self.annotated: dict[tuple[str, str], str] = {}  # (job uid, pod uid) -> discovery digest annotated
        self.marked: dict[tuple[str, str], dict[str, str]] = {}  # (job uid, pod uid) -> plan annotations made
        self.annotating: list[set[str]] = []  # per fan-out in flight: the jobs forgotten meanwhile

    def forget(self, uid: str) -> None:
        self.supported.discard(uid)
        self.refused.discard(uid)
        self.written = {k: v for k, v in self.written.items() if k[0] != uid}
        self.annotated = {k: v for k, v in self.annotated.items() if k[0] != uid}
        self.marked = {k: v for k, v in self.marked.items() if k[0] != uid}
        for forgotten in self.annotating:
            forgotten.add(uid)

    async def create_all(self, exp: Expectations, ref: JobRef, framework: str, objects: list[dict[str, Any]],
                         again: Sequence[dict[str, Any]] = ()) -> tuple[tuple[Reason, str] | None, bool]:
        """Create the supporting objects, then (once they are all this job's) the pods, concurrently;
        `again`, objects to create even if this process made them before (decide/supporting_steps.py).
        Returns why the job must fail, if it must, and whether to look again soon."""
        pods = [o for o in objects if o["kind"] == "Pod"]
        supporting = [o for o in objects if o["kind"] != "Pod"]
        if again and (verdict := await self._create_supporting(ref, again)) is not None:
            return verdict
        if supporting and ref.uid not in self.supported:
            if (verdict := await self._create_supporting(ref, supporting)) is not None:
                return verdict
            self.supported.add(ref.uid)
            self.groups.forget(ref.uid)
        return await self._create_pods(exp, ref, framework, pods), False

    async def _create_supporting(self, ref: JobRef, objects: Sequence[dict[str, Any]]
                                 ) -> tuple[tuple[Reason, str] | None, bool] | None:
        """Each object made, or found this job's; else create_all's answer for the first that isn't."""
        for obj in objects:
            what = f"{obj['kind']} {obj['metadata']['name']} can't be created"
            try:
                ownership = await self._create_owned(ref, obj)
            except Invalid as err:
                return (Reason.INVALID_OBJECT, f"{what}: {err}"), False
            except Refused as err:  # a ResourceQuota on count/secrets, a policy engine: may pass
                if isinstance(err, NotServed) and obj["kind"] in ("Workload", "PodGroup"):
                    self.groups.forget_served()  # a gang API version an upgrade removed: read what is served
                return (Reason.CREATE_REFUSED, f"{what}: {err}"), False
            if ownership is Ownership.FOREIGN:
                return (Reason.OBJECT_NOT_OWNED, not_owned_message(ref, obj)), False
            if ownership is Ownership.WAIT:
                return None, True
        return None

    async def _create_pods(self, exp: Expectations, ref: JobRef, framework: str,
                           pods: list[dict[str, Any]]) -> tuple[Reason, str] | None:
        """Create pods in batches of 8, 16, 32, ... (a batch at a time, each concurrently), stopping
        after a batch one of whose creates failed: Kubernetes' Job controller does the same from 1
        (pkg/controller/job, slowStartBatch) so that a job its quota or a webhook refuses costs
        a few requests, not one per pod, every pass (a 5,000-worker job in a 10-pod quota). From
        FIRST_BATCH, most jobs' pods are made in one round trip: from 1, a 5-pod job took three. A job
        whose last pass was refused starts from 1 again: its retries cost one refused create each."""
        size, start = 1 if ref.uid in self.refused else FIRST_BATCH, 0
        while start < len(pods):
            batch = pods[start:start + size]
            results = await asyncio.gather(*(self._create_pod(exp, ref, framework, p) for p in batch))
            if (failed := next((r for r in results if r is not None), None)) is not None:
                self.refused.add(ref.uid)
                return failed
            start, size = start + len(batch), size * 2
        if pods:  # made: not a pass whose creates a refusal's backoff held back (create_refusals.hold)
            self.refused.discard(ref.uid)
        return None

    async def _create_owned(self, ref: JobRef, obj: dict[str, Any]) -> Ownership:
        """Create `obj`; if its name is taken, whose is the object there?"""
        created = await self.kube.create(obj)
        if created:
            if obj["kind"] == "Service":
                metrics.JOBS_CREATED.inc()
            if obj["kind"] == "ConfigMap":
                self.written[(ref.uid, obj["metadata"]["name"])] = data_digest(obj["data"])
            return Ownership.OURS
        if obj["kind"] == "Secret":
            # Named for the job's uid (builders/mpi.py, secret_name): taken, it is this job's, made
            # before a restart. Not read: the operator has no `get` on Secrets (issue 31). Someone who
            # may create Secrets in the namespace could make one first under a queued job's name; who
            # may create pods there can mount and read the real one anyway (Kubernetes' own model:
            # a namespace's pod creators read its Secrets), so that gains no one access they lack.
            return Ownership.OURS
        return ownership(ref, await self.kube.get_metadata(obj))

    async def _create_pod(self, exp: Expectations, ref: JobRef, framework: str,
                          pod: dict[str, Any]) -> tuple[Reason, str] | None:
        """Create one pod. Returns why the job must fail: the API server found the pod invalid
        (the message names the template it came from), or the name belongs to something else."""
        name, labels = pod["metadata"]["name"], pod["metadata"]["labels"]
        pod_key = PodKey(labels[REPLICA_TYPE_LABEL], int(labels[REPLICA_INDEX_LABEL]))
        exp.expect_created(name, pod_key)
        async with self.creates:
            try:
                created = await self.kube.create(pod)
            except Invalid as err:
                exp.not_created(name)
                return Reason.INVALID_POD_TEMPLATE, f"spec.{framework}.{pod_key.replica_type}.template: {err}"
            except Refused as err:
                exp.not_created(name)
                return Reason.POD_CREATE_REFUSED, f"pod {name} can't be created: {err}"
            except BaseException:
                exp.not_created(name)
                raise
            if created:
                exp.created_as(name, created)
                metrics.PODS_CREATED.inc()
                return None
            # Taken, and not seen in our index as ours: an earlier job's pod (waited out on its
            # next event) or something else's.
            meta = await self.kube.get_metadata(pod)
            found = ownership(ref, meta)
            if found is Ownership.OURS:
                exp.created_as(name, str((meta or {}).get("uid") or ""))
            else:
                exp.not_created(name)
            if found is Ownership.FOREIGN:
                return Reason.OBJECT_NOT_OWNED, not_owned_message(ref, pod)
        return None

    async def keep_current(self, ref: JobRef, obj: dict[str, Any], remount: Sequence[ObservedPod] = ()) -> None:
        """Write `obj` (a ConfigMap) if its data differs from what we last wrote, or, in a process
        that hasn't written it (a restart, a failover), from what the object holds: read once,
        and only if it is this job's (derived from what exists, not from this process's past).
        After a write, the `remount` pods get its digest as an annotation: the pod update makes
        the kubelet sync them, and a sync sets up their ConfigMap volumes again with the new data
        (k8s.io/kubernetes v1.36.3, pkg/kubelet/volumemanager: WaitForAttachAndMount -> ReprocessPod).
        Lost in a crash between the two writes, the kubelet's periodic sync (a minute) does it."""
        memory = (ref.uid, obj["metadata"]["name"])
        if memory not in self.written:
            found = await self.kube.get(obj)
            if found is None or ownership(ref, found.get("metadata")) is not Ownership.OURS:
                return  # not made yet, or an earlier job's: made with this job's next pods
            self.written[memory] = data_digest(found.get("data") or {})
        digest = data_digest(obj["data"])
        if self.written.get(memory) != digest:
            if not await self.kube.patch_config_map_data(obj):
                return
            self.written[memory] = digest
        # Each pod's annotation is remembered only once made: a failed one (429, 500, a timeout)
        # raises, the pass is retried, and the annotation is tried again, not left to the kubelet's
        # minute (issue 31: longer than the default 30 s scale-down delay, so a removed worker was
        # killed before Horovod dropped it). A new process annotates once more: the same value.
        wanted = {DISCOVERY_ANNOTATION: digest}
        await self._annotate_each(ref, [(pod, wanted, digest) for pod in remount
                                        if self.annotated.get((ref.uid, pod.uid)) != digest], lambda: self.annotated)

    async def annotate(self, ref: JobRef, marks: Sequence[tuple[ObservedPod, dict[str, str]]]) -> None:
        """A plan's annotations (a checkpoint request), each pod patched once with each: a failed
        patch raises and the pass, which plans them again while the request stands, retries it."""
        await self._annotate_each(ref, [(pod, wanted, wanted) for pod, wanted in marks
                                        if self.marked.get((ref.uid, pod.uid)) != wanted], lambda: self.marked)

    async def _annotate_each(self, ref: JobRef, marks: Sequence[tuple[ObservedPod, dict[str, str], Any]],
                             memory: Callable[[], dict[tuple[str, str], Any]]) -> None:
        """Patch each pod with its annotations, concurrently within the operator's bound on writes in
        flight (the Controller's create_concurrency, 80): one at a time, a 1,024-worker job's checkpoint
        request reached its last pod 1,024 round trips after its first, seconds of a 30 s grace period
        (issue 45). Each patch made is remembered in `memory()`, whatever became of the others,
        unless the job was forgotten meanwhile (deleted: remembered then, it would be held forever);
        the first failure is raised once all have ended."""
        made: dict[tuple[str, str], Any] = {}
        forgotten: set[str] = set()

        async def one(pod: ObservedPod, wanted: dict[str, str], remembered: Any) -> None:
            async with self.creates:
                await self.kube.annotate_pod(ref.namespace, pod.name, pod.uid, wanted)
            made[(ref.uid, pod.uid)] = remembered

        self.annotating.append(forgotten)
        try:
            results = await asyncio.gather(*(one(*mark) for mark in marks), return_exceptions=True)
        finally:
            self.annotating = [other for other in self.annotating if other is not forgotten]  # this one, not an equal
            if ref.uid not in forgotten:
                memory().update(made)
        if failed := next((r for r in results if isinstance(r, BaseException)), None):
            raise failed
