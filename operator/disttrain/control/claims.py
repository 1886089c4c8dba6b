"""What the controller reads of a job's DRA claims (builders/claims.py counts them, purely).

An MPI job's worker slots default to its GPUs, and a worker that gets them through
`resourceClaims` names objects in the cluster: a ResourceClaimTemplate (a claim made per pod) or a
ResourceClaim (one claim shared). Their specs are immutable (resource.k8s.io/v1), so each is read
once and kept for the job's life; which DeviceClasses are GPUs is read at most once a minute. A job
whose worker slots are set (`slotsPerWorker`) or that asks for `nvidia.com/gpu` reads nothing.

The answer goes into the job's spec (`MPISpec.claimed_gpus`), so every builder (hostfile,
`-np`, discover_hosts.sh, Gloo's ranks) reads it as it reads nvidia.com/gpu. What can't be counted
(a GPU request of mode All, alternatives of different counts, a shared GPU claim on several
workers) is said as the job's trouble, and the job fails naming the claim. A claim object not
there yet (applied with the job, a moment later) is waited for (decide/claim_steps.py); once
counted, the count is kept in the job's status, which stands in for an object deleted later.

Each job reads its claims' objects itself (kept by job UID, not by name): a template deleted and
made again with another spec under the same name counts anew for the next job, never for a job
whose pods were made from the old one.

What is kept while a job waits for a claim object is each object's count (builders/claims.py
`ClaimCount`: a request's name and GPUs), never its spec: a namespace's editor can make 31
templates of 1.3 MB each (CEL selectors, within resource.k8s.io's limits) and jobs that name them
and one missing claim; kept whole, three such jobs held 120 MB of the controller's memory, and
every restart read them again. The counts kept are bounded in bytes (MAX_KEPT_BYTES, and
MAX_KEPT_BYTES_PER_NAMESPACE for one namespace's): the oldest job of a namespace past its share
is let go first, else the oldest; it reads its objects again on its next pass.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from disttrain.api.constants import CLAIMED_GPUS, MAX_CLAIMS
from disttrain.api.observed import ObservedPod
from disttrain.api.status import FINISHED, Phase
from disttrain.builders import claims
from disttrain.builders.claims import ClaimReading
from disttrain.builders.resources import template_gpus
from disttrain.decide.passes import JobState
from disttrain.runtime.clock import Clock

log = logging.getLogger(__name__)

RESOURCE_API = "resource.k8s.io/v1"
DEVICE_CLASS_TTL_SECONDS = 60.0
# The bytes of counts kept for jobs waiting on a claim object (ClaimCount.size): 32 claims of 32
# requests is about 130 KiB, a job's usual one claim of one request a few hundred bytes.
MAX_KEPT_BYTES = 4 << 20
# One namespace's share of it: past it, that namespace's own oldest job is let go, not another
# tenant's (a namespace filling the whole budget made every other namespace's waiting jobs re-read
# their objects every pass).
MAX_KEPT_BYTES_PER_NAMESPACE = 1 << 20


class ClaimAPI(Protocol):
    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None: ...
    async def list_cluster(self, api_version: str, kind: str) -> list[dict[str, Any]]: ...


class Claims:
    def __init__(self, kube: ClaimAPI, clock: Clock, gpu_classes: Iterable[str] = ()) -> None:
        self.kube, self.clock, self.named = kube, clock, frozenset(gpu_classes)
        # job uid -> "template/<name>" or "claim/<name>" -> its count, until the job's is in its status
        self.counts: dict[str, dict[str, claims.ClaimCount]] = {}
        self.kept_bytes = 0
        self.namespace_of: dict[str, str] = {}  # job uid -> its namespace, for the job's counts kept
        self.namespace_bytes: dict[str, int] = {}
        self._classes: tuple[float, frozenset[str]] | None = None

    def forget(self, uid: str) -> None:
        freed = sum(count.size for count in self.counts.pop(uid, {}).values())
        self.kept_bytes -= freed
        if (namespace := self.namespace_of.pop(uid, None)) is not None:
            self.namespace_bytes[namespace] -= freed
            if not self.namespace_bytes[namespace]:
                del self.namespace_bytes[namespace]

    async def observe(self, job: JobState, pods: Iterable[ObservedPod]) -> JobState:
        """`job` with what was read of its workers' claims (`job.claims`, `MPISpec.claimed_gpus`).
        Counted once: the count kept in its status is final (its pods' hostfile was built from it,
        whatever happens since to the objects or the DeviceClasses). A job whose pods were made
        before it could be counted (by an operator older than this) keeps their slots until it
        has none (a whole-job restart, a resume)."""
        mpi = job.spec.mpi
        if (mpi is None or mpi.slots_per_worker is not None or template_gpus(mpi.worker.template)
                or Phase(job.status.get("phase") or Phase.PENDING) in FINISHED):
            return job
        kept = job.status.get(CLAIMED_GPUS)
        if isinstance(kept, int) and not isinstance(kept, bool) and 0 <= kept <= claims.MAX_PER_WORKER:
            reading = ClaimReading(gpus=kept)
            self.forget(job.ref.uid)
        elif job.status.get("phase") and any(p.owner_uid == job.ref.uid for p in pods):
            # (a new job's first status follows its first pods: without a phase, it is counted)
            return job
        else:
            reading = await self._read(job)
        if reading.gpus:
            job = dataclasses.replace(job, spec=dataclasses.replace(
                job.spec, mpi=dataclasses.replace(mpi, claimed_gpus=reading.gpus)))
        return dataclasses.replace(job, claims=reading)

    async def _read(self, job: JobState) -> ClaimReading:
        mpi = job.spec.mpi
        assert mpi is not None
        try:
            wanted = claims.pod_claims(mpi.worker.template)
        except claims.UncountableClaim as err:
            return ClaimReading(trouble=str(err))
        if not wanted:
            return ClaimReading()
        gpu_classes = await self.gpu_classes()
        counts = {}
        for claim in wanted[:MAX_CLAIMS]:
            found = await self._count(job.ref.uid, job.ref.namespace, claim, gpu_classes)
            if found is None:
                return ClaimReading(missing=f"{claim.kind} {claim.object_name}")
            counts[claim.key] = found
        try:
            gpus = claims.template_claim_gpus(mpi.worker.template, counts)
            shared = claims.shared_gpu_claims(mpi.worker.template, counts)
        except claims.UncountableClaim as err:
            return ClaimReading(trouble=str(err))
        most = mpi.elastic.max_replicas if mpi.elastic is not None else mpi.worker.replicas
        if shared and most > 1:
            return ClaimReading(trouble=(
                f"spec.mpi.worker: ResourceClaim {shared[0]} allocates GPUs and is shared by all "
                f"{most} workers, which would all get the same devices: use a "
                f"ResourceClaimTemplate (a claim per pod)"))
        return ClaimReading(gpus=gpus)

    async def _count(self, uid: str, namespace: str, claim: claims.PodClaim,
                     gpu_classes: frozenset[str]) -> claims.ClaimCount | None:
        """The claim object's count, read once a job; None while it doesn't exist. A count made
        when other device classes were GPUs is made again (the job isn't counted yet)."""
        kept = self.counts.get(uid, {}).get(claim.key)
        if kept is not None and kept.gpu_classes == gpu_classes:
            return kept
        found = await self.kube.get({"apiVersion": RESOURCE_API, "kind": claim.kind,
                                     "metadata": {"namespace": namespace, "name": claim.object_name}})
        if found is None:
            return None
        count = claims.count_claim(claims.claim_spec(claim.kind, found), gpu_classes)
        del found  # the spec goes now: only the count is kept
        self._keep(uid, namespace, claim.key, count)
        return count

    def _keep(self, uid: str, namespace: str, key: str, count: claims.ClaimCount) -> None:
        job = self.counts.setdefault(uid, {})
        self.namespace_of[uid] = namespace
        grown = count.size - (job[key].size if key in job else 0)
        self.kept_bytes += grown
        self.namespace_bytes[namespace] = self.namespace_bytes.get(namespace, 0) + grown
        job[key] = count
        while self.kept_bytes > MAX_KEPT_BYTES and self.counts:
            # The oldest job of a namespace past its share, else the oldest: it reads its objects again.
            crowded = self.namespace_bytes.get(namespace, 0) > MAX_KEPT_BYTES_PER_NAMESPACE
            self.forget(next(u for u in self.counts if not crowded or self.namespace_of.get(u) == namespace))

    async def gpu_classes(self) -> frozenset[str]:
        now = self.clock.monotonic()
        if self._classes is None or now - self._classes[0] > DEVICE_CLASS_TTL_SECONDS:
            found = await self.kube.list_cluster(RESOURCE_API, "DeviceClass")
            self._classes = (now, claims.gpu_device_classes(found, self.named))
        return self._classes[1]
