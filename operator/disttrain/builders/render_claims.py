"""`disttrain render` and DRA: the claims each pod gets, and an MPI worker's slots counted from the
ResourceClaimTemplates, ResourceClaims and DeviceClasses in the same file, as the operator counts
them from the cluster (control/claims.py). Which classes are GPUs: those the file's DeviceClasses
pin to gpu.nvidia.com, the class of that name (NVIDIA's driver makes it), and any `--gpu-device-class`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from disttrain.api.constants import REPLICA_TYPE_LABEL
from disttrain.api.spec import JobSpec, ReplicaType
from disttrain.builders import claims


@dataclasses.dataclass(frozen=True)
class FileClaims:
    """The DRA objects of a rendered file: claim specs by `template/<name>` or `claim/<name>`."""

    specs: Mapping[str, Mapping[str, Any]]
    gpu_classes: frozenset[str]


def file_claims(docs: Iterable[Mapping[str, Any]], named: Iterable[str] = ()) -> FileClaims:
    docs = list(docs)
    specs: dict[str, Mapping[str, Any]] = {
        claims.claim_key(doc["kind"], str((doc.get("metadata") or {}).get("name") or "")):
            claims.claim_spec(doc["kind"], doc)
        for doc in docs if doc.get("kind") in ("ResourceClaimTemplate", "ResourceClaim")}
    classes = [d for d in docs if d.get("kind") == "DeviceClass"]
    return FileClaims(specs, claims.gpu_device_classes(classes, {claims.NVIDIA_DRIVER, *named}))


def with_claimed_gpus(spec: JobSpec, found: FileClaims) -> JobSpec:
    """`spec` with its MPI workers' claimed GPUs, when every claim they name is in the file
    (claims.UncountableClaim for one that can't be counted)."""
    mpi = spec.mpi
    if mpi is None:
        return spec
    wanted = claims.pod_claims(mpi.worker.template)
    if not wanted or any(c.key not in found.specs for c in wanted):
        return spec
    counts = {key: claims.count_claim(spec, found.gpu_classes) for key, spec in found.specs.items()}
    gpus = claims.template_claim_gpus(mpi.worker.template, counts)
    return dataclasses.replace(spec, mpi=dataclasses.replace(mpi, claimed_gpus=gpus or None))


def claims_comment(spec: JobSpec, pod: Mapping[str, Any], found: FileClaims) -> str:
    """What each of the pod's resourceClaims gives it, as YAML comments."""
    if pod.get("kind") != "Pod":
        return ""
    name = pod["metadata"]["name"]
    try:
        entries = claims.pod_claims(pod)
    except claims.UncountableClaim:
        return f"# {name}: a resourceClaims entry names no ResourceClaim or ResourceClaimTemplate by a valid name\n"
    if not entries:
        return ""
    lines = [f"# {name}'s DRA claims:"]
    for claim in entries:
        said = _devices(found.specs.get(claim.key), found.gpu_classes)
        if claim.template:
            lines.append(f"#   {claim.name}: its own ResourceClaim, made from ResourceClaimTemplate {claim.template}"
                         f" ({said})")
        else:
            lines.append(f"#   {claim.name}: ResourceClaim {claim.shared}, shared with every pod naming it ({said})")
    role = (pod["metadata"].get("labels") or {}).get(REPLICA_TYPE_LABEL)
    mpi = spec.mpi
    if mpi is not None and role == ReplicaType.WORKER and mpi.slots_per_worker is None and mpi.claimed_gpus:
        lines.append(f"#   so {mpi.claimed_gpus} MPI slot(s): one per GPU claimed")
    return "\n".join(lines) + "\n"


def _devices(spec: Mapping[str, Any] | None, gpu_classes: frozenset[str]) -> str:
    if spec is None:
        return "not in this file: its devices aren't known here"
    asked = []
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = (devices if isinstance(devices, Mapping) else {}).get("requests")
    for request in requests if isinstance(requests, list) else []:
        request = request if isinstance(request, Mapping) else {}
        exact, alternatives = request.get("exactly"), request.get("firstAvailable")
        found = [exact] if exact else alternatives if isinstance(alternatives, list) else []
        options = [_asked(o, gpu_classes) for o in found if isinstance(o, Mapping)]
        if options:
            asked.append(options[0] if len(options) == 1 else "one of " + " or ".join(options))
    return ", ".join(asked) or "no devices"


def _asked(option: Mapping[str, Any], gpu_classes: frozenset[str]) -> str:
    klass = str(option.get("deviceClassName", "?"))[:253]
    count = "all" if option.get("allocationMode") == "All" else str(option.get("count") or 1)[:20]
    # A class render can't tell is a GPU's (no DeviceClass in the file, not NVIDIA's) gives no
    # slots: say how to count it, rather than leave the user to wonder why the worker has one.
    return f"{count} of {klass}" + (" (GPUs)" if klass in gpu_classes else
                                    f" (not counted as GPUs: --gpu-device-class {klass} would)")
