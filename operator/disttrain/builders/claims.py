"""The GPUs a pod gets through Dynamic Resource Allocation (resource.k8s.io/v1): what its template's
`resourceClaims` ask of the device classes that are GPUs.

A pod template names its claims in `spec.resourceClaims`: a `resourceClaimTemplateName` (a claim made
for each pod: its devices are the pod's own) or a `resourceClaimName` (one claim every pod naming it
shares). A claim's spec asks `devices.requests[]`, each `exactly` (a device class, `allocationMode`
ExactCount with `count`, 1 by default, or All) or `firstAvailable` (alternatives the scheduler picks
one of). Kubernetes 1.36, staging/src/k8s.io/api/resource/v1/types.go; Kueue v0.19.2 counts the same
way for quota (pkg/dra/claims.go countDevicesPerClass: ExactCount only, templates only).

Which device classes are GPUs: those whose selectors pin NVIDIA's driver (`device.driver ==
"gpu.nvidia.com"`, as its DeviceClass `gpu.nvidia.com` does), plus any the operator is told
(`disttrain run --gpu-device-class`, the chart's `dra.gpuDeviceClasses`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

NVIDIA_DRIVER = "gpu.nvidia.com"
_DRIVER_PIN = re.compile(r"""device\.driver\s*==\s*(["'])([^"']+)\1""")


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod template's spec.resourceClaims."""

    name: str
    template: str | None  # resourceClaimTemplateName: a claim per pod
    shared: str | None  # resourceClaimName: one claim for every pod naming it


@dataclass(frozen=True)
class ClaimReading:
    """What was read of an MPI job's worker claims (control/claims.py): the GPUs a worker gets, or
    why they can't be counted (`trouble`) or aren't known yet (`missing`: a claim object not there)."""

    gpus: int | None = None
    trouble: str | None = None
    missing: str | None = None


class UncountableClaim(ValueError):
    """A claim whose number of GPUs can't be known before the scheduler allocates it."""

    def __str__(self) -> str:
        return f"spec.mpi.worker's claims: {self.args[0]}: set spec.mpi.slotsPerWorker"


def pod_claims(template: Mapping[str, Any]) -> list[PodClaim]:
    found = []
    for entry in (template.get("spec") or {}).get("resourceClaims") or []:
        if isinstance(entry, Mapping) and entry.get("name"):
            found.append(PodClaim(str(entry["name"]), entry.get("resourceClaimTemplateName") or None,
                                  entry.get("resourceClaimName") or None))
    return found


def driver_of(device_class: Mapping[str, Any]) -> str | None:
    """The driver a DeviceClass's CEL selectors pin (`device.driver == "..."`), if one does."""
    for selector in (device_class.get("spec") or {}).get("selectors") or []:
        expression = str(((selector or {}).get("cel") or {}).get("expression") or "")
        if (pinned := _DRIVER_PIN.search(expression)) is not None:
            return pinned.group(2)
    return None


def gpu_device_classes(device_classes: Iterable[Mapping[str, Any]], named: Iterable[str] = ()) -> frozenset[str]:
    """The device classes counted as GPUs: NVIDIA's driver's, and those named."""
    pinned = {str((c.get("metadata") or {}).get("name")) for c in device_classes if driver_of(c) == NVIDIA_DRIVER}
    return frozenset(pinned | set(named))


def claim_gpus(claim_spec: Mapping[str, Any], gpu_classes: frozenset[str]) -> int:
    """GPUs a claim of this spec allocates. UncountableClaim for a GPU request of mode All (as many
    as the node has) or alternatives of different GPU counts (the scheduler picks one)."""
    total = 0
    for index, request in enumerate((claim_spec.get("devices") or {}).get("requests") or []):
        where = f"devices.requests[{index}] ({request.get('name', '')})"
        if request.get("firstAvailable"):
            counts = {_exact_gpus(sub, gpu_classes, where) for sub in request["firstAvailable"]}
            if len(counts) > 1:
                raise UncountableClaim(f"{where}: firstAvailable alternatives of {sorted(counts)} GPUs")
            total += counts.pop()
        else:
            total += _exact_gpus(request.get("exactly") or {}, gpu_classes, where)
    return total


def _exact_gpus(request: Mapping[str, Any], gpu_classes: frozenset[str], where: str) -> int:
    if request.get("deviceClassName") not in gpu_classes:
        return 0
    mode = request.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise UncountableClaim(f"{where}: allocationMode {mode} of device class {request['deviceClassName']}")
    return int(request.get("count") or 1)


def template_claim_gpus(template: Mapping[str, Any], specs: Mapping[str, Mapping[str, Any]],
                        gpu_classes: frozenset[str]) -> int:
    """GPUs a pod made from `template` gets through its claims, from `specs`: each claim's spec by
    `template/<name>` (a ResourceClaimTemplate's spec.spec) or `claim/<name>` (a ResourceClaim's
    spec). A claim whose spec isn't there counts none."""
    total = 0
    for claim in pod_claims(template):
        key = f"template/{claim.template}" if claim.template else f"claim/{claim.shared}"
        if (spec := specs.get(key)) is not None:
            total += claim_gpus(spec, gpu_classes)
    return total


def shared_gpu_claims(template: Mapping[str, Any], specs: Mapping[str, Mapping[str, Any]],
                      gpu_classes: frozenset[str]) -> list[str]:
    """The shared ResourceClaims (resourceClaimName) of a template that allocate GPUs: every pod of a
    multi-pod replica naming one gets the same devices, which training with a rank per GPU can't use."""
    return [claim.shared for claim in pod_claims(template) if claim.shared and
            (spec := specs.get(f"claim/{claim.shared}")) is not None and claim_gpus(spec, gpu_classes) > 0]
