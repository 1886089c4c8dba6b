"""The GPUs a pod gets through Dynamic Resource Allocation (resource.k8s.io/v1): what its template's
`resourceClaims` ask of the device classes that are GPUs.

A pod template names its claims in `spec.resourceClaims`: a `resourceClaimTemplateName` (a claim made
for each pod: its devices are the pod's own) or a `resourceClaimName` (one claim every pod naming it
shares). A claim's spec asks `devices.requests[]`, each `exactly` (a device class, `allocationMode`
ExactCount with `count`, 1 by default, or All) or `firstAvailable` (alternatives the scheduler picks
one of). Kubernetes 1.36, staging/src/k8s.io/api/resource/v1/types.go; a claim is never allocated
more than 32 devices (AllocationResultsMaxSize). A request with `adminAccess` watches devices other
claims hold: no GPU of its own. Kueue v0.19.2 counts ExactCount requests of templates for quota and
finds a Workload with `firstAvailable`, `All` or `adminAccess` inadmissible (pkg/dra/claims.go).

Which device classes are GPUs: those whose selectors pin NVIDIA's driver (`device.driver ==
"gpu.nvidia.com"`, as its DeviceClass `gpu.nvidia.com` does), plus any the operator is told
(`disttrain run --gpu-device-class`, the chart's `dra.gpuDeviceClasses`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from disttrain.api.constants import CLAIM_NAME_PATTERN, MAX_CLAIMS, MAX_DEVICES_PER_CLAIM

NVIDIA_DRIVER = "gpu.nvidia.com"
_DRIVER_PIN = re.compile(r"""device\.driver\s*==\s*(["'])([^"']+)\1|(["'])([^"']+)\3\s*==\s*device\.driver""")
MAX_PER_WORKER = MAX_CLAIMS * MAX_DEVICES_PER_CLAIM
# Checked here too, not only by the CRD: a name goes into a request path (control/claims.py), and a
# job stored before the CRD said so is still read.
CLAIM_NAME = re.compile(CLAIM_NAME_PATTERN)


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod template's spec.resourceClaims."""

    name: str
    template: str | None  # resourceClaimTemplateName: a claim per pod
    shared: str | None  # resourceClaimName: one claim for every pod naming it

    @property
    def kind(self) -> str:
        """The kind of the object it names."""
        return "ResourceClaimTemplate" if self.template else "ResourceClaim"

    @property
    def object_name(self) -> str:
        return str(self.template or self.shared)

    @property
    def key(self) -> str:
        """How its object's claim spec is looked up (`claim_key`)."""
        return claim_key(self.kind, self.object_name)


def claim_key(kind: str, name: str) -> str:
    """A claim spec's key: `template/<name>` (a ResourceClaimTemplate) or `claim/<name>` (a ResourceClaim)."""
    return f"{'template' if kind == 'ResourceClaimTemplate' else 'claim'}/{name}"


def claim_spec(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The claim spec of a ResourceClaimTemplate (its spec.spec) or a ResourceClaim (its spec), by
    the kind it was asked for or found as (an object read back by a get carries no kind of its own
    to trust)."""
    held = obj.get("spec")
    if isinstance(held, Mapping) and kind == "ResourceClaimTemplate":
        held = held.get("spec")
    return dict(held) if isinstance(held, Mapping) else {}


@dataclass(frozen=True)
class ClaimReading:
    """What was read of an MPI job's worker claims (control/claims.py): the GPUs a worker gets, or
    why they can't be counted (`trouble`) or aren't known yet (`missing`: a claim object not there)."""

    gpus: int | None = None
    trouble: str | None = None
    missing: str | None = None


class UncountableClaim(ValueError):
    """A claim whose number of GPUs can't be known before the scheduler allocates it, or an entry
    that names no claim object by a valid name."""

    def __init__(self, what: str, fix: str = "set spec.mpi.slotsPerWorker") -> None:
        super().__init__(what, fix)

    def __str__(self) -> str:
        return f"spec.mpi.worker's claims: {self.args[0]}: {self.args[1]}"


def pod_claims(template: Mapping[str, Any]) -> list[PodClaim]:
    """The template's claim entries; UncountableClaim for one naming no object, or not by a DNS
    subdomain (the CRD refuses both at apply: a job stored before it said so is still read safely)."""
    found = []
    for index, entry in enumerate((template.get("spec") or {}).get("resourceClaims") or []):
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        named = [entry.get(k) for k in ("resourceClaimTemplateName", "resourceClaimName") if entry.get(k) is not None]
        if len(named) != 1 or not isinstance(named[0], str) or not valid_name(named[0]):
            raise UncountableClaim(f"resourceClaims[{index}] names no ResourceClaim or ResourceClaimTemplate",
                                   "set exactly one of resourceClaimName and resourceClaimTemplateName, a DNS name")
        template_name = named[0] if entry.get("resourceClaimTemplateName") is not None else None
        found.append(PodClaim(str(entry.get("name") or ""), template_name, None if template_name else named[0]))
    return found


def valid_name(name: str) -> bool:
    return len(name) <= 253 and CLAIM_NAME.fullmatch(name) is not None


def driver_of(device_class: Mapping[str, Any]) -> str | None:
    """The driver a DeviceClass's CEL selectors pin (`device.driver == "..."`), if one does."""
    for selector in _list((device_class.get("spec") or {}).get("selectors")):
        expression = str(((selector if isinstance(selector, Mapping) else {}).get("cel") or {}).get("expression") or "")
        if (pinned := _DRIVER_PIN.search(expression)) is not None:
            return pinned.group(2) or pinned.group(4)
    return None


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def gpu_device_classes(device_classes: Iterable[Mapping[str, Any]], named: Iterable[str] = ()) -> frozenset[str]:
    """The device classes counted as GPUs: NVIDIA's driver's, and those named."""
    pinned = {str((c.get("metadata") or {}).get("name")) for c in device_classes if driver_of(c) == NVIDIA_DRIVER}
    return frozenset(pinned | set(named))


@dataclass(frozen=True)
class ClaimCount:
    """What counting needs of one claim object, kept in its spec's place (control/claims.py): each
    request's GPUs, or why that request can't be counted. A spec can be megabytes (32 requests of
    CEL selectors of 10 KiB each, within resource.k8s.io's limits); this is a few bytes a request."""

    requests: tuple[tuple[str, int | str], ...] = ()
    trouble: str | None = None  # the claim as a whole can't be counted
    gpu_classes: frozenset[str] = frozenset()  # the classes counted as GPUs (one set, shared by all counts)

    def gpus(self, request: str | None = None) -> int:
        """GPUs the claim gives a container that names `request` (None: the whole claim)."""
        if self.trouble is not None:
            raise UncountableClaim(self.trouble)
        total = 0
        for name, counted in self.requests:
            if request is None or name == request:
                if isinstance(counted, str):
                    raise UncountableClaim(counted)
                total += counted
        return total

    @property
    def size(self) -> int:
        """About the bytes it keeps: what control/claims.py bounds its cache by."""
        return 64 + sum(64 + len(name) + (len(c) if isinstance(c, str) else 0) for name, c in self.requests) \
            + len(self.trouble or "")


def count_claim(claim_spec: Mapping[str, Any], gpu_classes: frozenset[str]) -> ClaimCount:
    """Each request of a claim of this spec, with the GPUs it allocates or why that can't be known: a
    GPU request of mode All (as many as the node has), alternatives of different GPU counts (the
    scheduler picks one), a count that is no whole number from 1 to 32; and the claim as a whole
    when it asks more than the 32 devices a claim can be allocated."""
    counted: list[tuple[str, int | str]] = []
    total = 0
    devices = claim_spec.get("devices") if isinstance(claim_spec, Mapping) else None
    for index, request in enumerate(_list((devices if isinstance(devices, Mapping) else {}).get("requests"))):
        request = request if isinstance(request, Mapping) else {}
        name = str(request.get("name", ""))[:63]
        where = f"devices.requests[{index}] ({name})"
        if index >= MAX_DEVICES_PER_CLAIM:  # resource.k8s.io allows 32 requests: kept bounded all the same
            return ClaimCount(trouble=f"{where}: more than {MAX_DEVICES_PER_CLAIM} requests", gpu_classes=gpu_classes)
        try:
            gpus = _request_gpus(request, gpu_classes, where)
        except UncountableClaim as err:
            counted.append((name, str(err.args[0])))
            continue
        counted.append((name, gpus))
        total += gpus
        if total > MAX_DEVICES_PER_CLAIM:
            return ClaimCount(trouble=f"{where}: more than {MAX_DEVICES_PER_CLAIM} GPUs, the most a claim is allocated",
                              gpu_classes=gpu_classes)
    return ClaimCount(tuple(counted), gpu_classes=gpu_classes)


def _request_gpus(request: Mapping[str, Any], gpu_classes: frozenset[str], where: str) -> int:
    if request.get("firstAvailable"):
        counts = {_exact_gpus(sub, gpu_classes, where) for sub in _list(request["firstAvailable"])} or {0}
        if len(counts) > 1:
            raise UncountableClaim(f"{where}: firstAvailable alternatives of {sorted(counts)} GPUs")
        return counts.pop()
    return _exact_gpus(request.get("exactly") or {}, gpu_classes, where)


def _exact_gpus(request: Any, gpu_classes: frozenset[str], where: str) -> int:
    if not isinstance(request, Mapping) or not isinstance(request.get("deviceClassName"), str) \
            or request["deviceClassName"] not in gpu_classes or request.get("adminAccess") is True:
        return 0
    mode = request.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise UncountableClaim(f"{where}: allocationMode {str(mode)[:20]} of device class {request['deviceClassName']}")
    count = request.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_DEVICES_PER_CLAIM:
        raise UncountableClaim(f"{where}: count {str(count)[:20]} is not a number of GPUs from 1 to "
                               f"{MAX_DEVICES_PER_CLAIM}")
    return count


def container_claims(template: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The claims the rank container (the first: where MPI starts the ranks) is given, as
    (pod claim name, request name or None for all of the claim): a container sees only the claims
    its `resources.claims` names (Kubernetes' ResourceClaim docs), whatever the pod has."""
    containers = _list((template.get("spec") or {}).get("containers"))
    first = containers[0] if containers and isinstance(containers[0], Mapping) else {}
    named = _list((first.get("resources") or {}).get("claims") if isinstance(first.get("resources"), Mapping) else [])
    found = []
    for entry in named[:MAX_CLAIMS * MAX_DEVICES_PER_CLAIM]:
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            request = entry.get("request")
            found.append((entry["name"], request if isinstance(request, str) and request else None))
    return found


def template_claim_gpus(template: Mapping[str, Any], counts: Mapping[str, ClaimCount]) -> int:
    """GPUs the rank container of a pod made from `template` gets through its claims: the claims and
    requests it names, counted from `counts` (by `template/<name>` or `claim/<name>`). A claim whose
    count isn't there counts none. A claim named twice (once whole, once a request) counts once."""
    by_name = {claim.name: claim for claim in pod_claims(template)}
    asked: dict[str, set[str | None]] = {}
    for name, request in container_claims(template):
        asked.setdefault(name, set()).add(request)
    total = 0
    for name, requests in asked.items():
        claim = by_name.get(name)
        if claim is None or (count := counts.get(claim.key)) is None:
            continue
        total += count.gpus() if None in requests else sum(count.gpus(r) for r in requests)
    return total


def shared_gpu_claims(template: Mapping[str, Any], counts: Mapping[str, ClaimCount]) -> list[str]:
    """The shared ResourceClaims (resourceClaimName) of a template that allocate GPUs: every pod of a
    multi-pod replica naming one gets the same devices, which training with a rank per GPU can't use."""
    return [claim.shared for claim in pod_claims(template) if claim.shared and
            (count := counts.get(claim.key)) is not None and count.gpus() > 0]
