"""A job's identity, and what makes an object the job's own: its controller owner reference.

A DistTrainJob deleted and applied again under the same name is a new job with a new UID, while
the old one's pods, Service, ConfigMap and Secret live on until garbage collection removes them.
Names alone would mix the two, so every child is trusted only once its controller reference
carries this job's UID (as client-go's `metav1.IsControlledBy` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from disttrain.api.constants import API_VERSION, KIND


@dataclass(frozen=True)
class JobRef:
    """What the builders need to know about the job object itself."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class PodKey:
    replica_type: str
    index: int


def owner_reference(job: JobRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(job: JobRef, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner_reference(job)],
    }


def controller_of(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked `controller: true`, if any (an object has at most one)."""
    return next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)


def controller_uid(meta: Mapping[str, Any]) -> str:
    ref = controller_of(meta)
    return str(ref.get("uid") or "") if ref else ""


def is_controlled_by(meta: Mapping[str, Any], job: JobRef) -> bool:
    return controller_uid(meta) == job.uid


def is_from_earlier_job(meta: Mapping[str, Any], job: JobRef) -> bool:
    """Controlled by a DistTrainJob of the same name with another UID: one that was deleted (only
    one object of a name exists at a time), whose children garbage collection is removing."""
    ref = controller_of(meta)
    return (ref is not None and ref.get("kind") == KIND and ref.get("name") == job.name
            and ref.get("uid") != job.uid)


class Ownership(Enum):
    OURS = "ours"
    WAIT = "wait"  # an earlier job's object, or one on its way out: garbage collection is removing it
    FOREIGN = "foreign"  # something else's: the job can't run under this name


def ownership(ref: JobRef, meta: Mapping[str, Any] | None) -> Ownership:
    """Who holds a name our create found taken. Gone by now (None), on its way out, or an earlier
    job's: wait for garbage collection. Ours: fine (our index or memory lagged)."""
    if meta is None or meta.get("deletionTimestamp") or is_from_earlier_job(meta, ref):
        return Ownership.WAIT
    return Ownership.OURS if is_controlled_by(meta, ref) else Ownership.FOREIGN


def not_owned_message(ref: JobRef, obj: Mapping[str, Any]) -> str:
    return (f"{obj['kind']} {ref.namespace}/{obj['metadata']['name']} already exists and is not controlled by "
            f"this DistTrainJob; delete it or give the job another name")
