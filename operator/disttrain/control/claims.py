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
there yet (applied with the job, a moment later) is waited for.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from disttrain.builders import claims
from disttrain.builders.resources import template_gpus
from disttrain.decide.passes import JobState
from disttrain.runtime.clock import Clock

log = logging.getLogger(__name__)

RESOURCE_API = "resource.k8s.io/v1"
DEVICE_CLASS_TTL_SECONDS = 60.0
MAX_SPECS = 4096  # claim specs kept: a few per job


class ClaimAPI(Protocol):
    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None: ...
    async def list_cluster(self, api_version: str, kind: str) -> list[dict[str, Any]]: ...


@dataclasses.dataclass(frozen=True)
class ClaimReading:
    """What was read of a job's worker claims: its GPUs, or why they can't be counted (`trouble`)
    or aren't known yet (`missing`: a claim object not there)."""

    gpus: int | None = None
    trouble: str | None = None
    missing: str | None = None


class Claims:
    def __init__(self, kube: ClaimAPI, clock: Clock, gpu_classes: Iterable[str] = ()) -> None:
        self.kube, self.clock, self.named = kube, clock, frozenset(gpu_classes)
        self.specs: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, "template/<name>"): its claim spec
        self._classes: tuple[float, frozenset[str]] | None = None

    async def observe(self, job: JobState) -> tuple[JobState, ClaimReading]:
        mpi = job.spec.mpi
        if mpi is None or mpi.slots_per_worker is not None or template_gpus(mpi.worker.template):
            return job, ClaimReading()
        wanted = claims.pod_claims(mpi.worker.template)
        if not wanted:
            return job, ClaimReading()
        specs = {}
        for claim in wanted:
            key = f"template/{claim.template}" if claim.template else f"claim/{claim.shared}"
            found = await self._spec(job.ref.namespace, key)
            if found is None:
                kind = "ResourceClaimTemplate" if claim.template else "ResourceClaim"
                return job, ClaimReading(missing=f"{kind} {claim.template or claim.shared}")
            specs[key] = found
        gpu_classes = await self.gpu_classes()
        try:
            gpus = claims.template_claim_gpus(mpi.worker.template, specs, gpu_classes)
        except claims.UncountableClaim as err:
            return job, ClaimReading(trouble=f"spec.mpi.worker's claims: {err}: set spec.mpi.slotsPerWorker")
        shared = claims.shared_gpu_claims(mpi.worker.template, specs, gpu_classes)
        if shared and mpi.worker.replicas > 1:
            return job, ClaimReading(trouble=(
                f"spec.mpi.worker: ResourceClaim {shared[0]} allocates GPUs and is shared by all "
                f"{mpi.worker.replicas} workers, which would all get the same devices: use a "
                f"ResourceClaimTemplate (a claim per pod)"))
        spec = dataclasses.replace(job.spec, mpi=dataclasses.replace(mpi, claimed_gpus=gpus or None))
        return dataclasses.replace(job, spec=spec), ClaimReading(gpus=gpus)

    async def _spec(self, namespace: str, key: str) -> dict[str, Any] | None:
        if (namespace, key) in self.specs:
            return self.specs[(namespace, key)]
        kind, name = key.split("/", 1)
        obj = {"apiVersion": RESOURCE_API, "metadata": {"namespace": namespace, "name": name},
               "kind": "ResourceClaimTemplate" if kind == "template" else "ResourceClaim"}
        found = await self.kube.get(obj)
        if found is None:
            return None
        held = found.get("spec") or {}
        spec = dict(held.get("spec") or {}) if kind == "template" else dict(held)
        if len(self.specs) >= MAX_SPECS:
            self.specs.pop(next(iter(self.specs)))
        self.specs[(namespace, key)] = spec
        return spec

    async def gpu_classes(self) -> frozenset[str]:
        now = self.clock.monotonic()
        if self._classes is None or now - self._classes[0] > DEVICE_CLASS_TTL_SECONDS:
            found = await self.kube.list_cluster(RESOURCE_API, "DeviceClass")
            self._classes = (now, claims.gpu_device_classes(found, self.named))
        return self._classes[1]
