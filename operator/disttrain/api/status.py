"""The job's status: counts per replica type, the READY column, phase and conditions.

Everything here is a pure function of the previous status, the observed pods and the clock,
and a value changes only when what it describes changes, so the operator writes status only
on a real transition and nothing flaps.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from disttrain.api.observed import ObservedPod
from disttrain.api.spec import JobSpec
from disttrain.api.times import parse_timestamp


class Phase(StrEnum):
    QUEUED = "Queued"  # waiting for Kueue to admit its Workload: no pod exists
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


FINISHED = (Phase.SUCCEEDED, Phase.FAILED)
# The conditions a job can carry. Created is True once every pod of the current attempt exists;
# each of the others but Stalled belongs to the phase of the same name (Pending has none: it is the
# absence of the rest). Stalled is True while the training's reported step stands still past its
# timeout (decide/policies/stall.py).
CONDITION_TYPES = ("Queued", "Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Stalled")


def timestamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_timestamp(moment: datetime.datetime) -> str:
    """An RFC 3339 time to the microsecond (a wait measured from it loses no fraction of a second)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def true_since(status: Mapping[str, Any], ctype: str) -> datetime.datetime | None:
    """When the status's condition `ctype` turned True; None unless it is True (its time is then
    when it turned False) or its time can't be read."""
    found = next((c for c in status.get("conditions") or [] if c.get("type") == ctype), None)
    if found is None or found.get("status") != "True":
        return None
    return parse_timestamp(found.get("lastTransitionTime"))


def replica_statuses(spec: JobSpec, pods: Iterable[ObservedPod]) -> dict[str, dict[str, int]]:
    counts = {rtype: {"active": 0, "ready": 0, "succeeded": 0, "failed": 0} for rtype in spec.replicas}
    for pod in pods:
        entry = counts.get(pod.replica_type)
        if entry is None or pod.terminating:
            continue
        if pod.active:
            entry["active"] += 1
        if pod.active and pod.ready:
            entry["ready"] += 1
        if pod.phase == "Succeeded":
            entry["succeeded"] += 1
        if pod.phase == "Failed":
            entry["failed"] += 1
    return counts


def ready_column(spec: JobSpec, counts: Mapping[str, Mapping[str, int]]) -> str:
    return f"{sum(c['ready'] for c in counts.values())}/{spec.total_pods}"


def set_condition(
    conditions: list[dict[str, Any]], ctype: str, status: bool, reason: str, message: str, now: str
) -> list[dict[str, Any]]:
    """The conditions with `ctype` set. The transition time moves only when the status flips;
    a condition never present and now False is not added (it would say nothing)."""
    value = "True" if status else "False"
    out = []
    found = False
    for cond in conditions:
        if cond.get("type") != ctype:
            out.append(cond)
            continue
        found = True
        if cond.get("status") == value and cond.get("reason") == reason and cond.get("message") == message:
            out.append(cond)
            continue
        changed = cond.get("status") != value
        out.append({
            "type": ctype, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": now if changed else cond.get("lastTransitionTime", now),
        })
    if not found and status:
        out.append({"type": ctype, "status": value, "reason": reason, "message": message,
                    "lastTransitionTime": now})
    return out


def enter_phase(
    status: dict[str, Any], phase: Phase, reason: str, message: str, now: str
) -> dict[str, Any]:
    """`status` moved to `phase`: its condition True, the conditions it ends False."""
    out = dict(status)
    out["phase"] = phase.value
    out["reason"] = reason
    out["message"] = message
    conditions = list(status.get("conditions") or [])
    # Each phase switches off the conditions that can't hold alongside it.
    ends = {
        Phase.QUEUED: ("Running", "Restarting", "Suspended"),
        Phase.PENDING: ("Queued", "Running", "Restarting", "Suspended"),
        Phase.RUNNING: ("Queued", "Restarting", "Suspended"),
        Phase.RESTARTING: ("Queued", "Running", "Suspended"),
        Phase.SUSPENDED: ("Queued", "Running", "Restarting"),
        Phase.SUCCEEDED: ("Queued", "Running", "Restarting", "Suspended"),
        Phase.FAILED: ("Queued", "Running", "Restarting", "Suspended"),
    }[phase]
    for ctype in ends:
        existing = next((c for c in conditions if c.get("type") == ctype), None)
        if existing is not None and existing.get("status") == "True":
            conditions = set_condition(conditions, ctype, False, reason, message, now)
    if phase is not Phase.PENDING:
        conditions = set_condition(conditions, phase.value, True, reason, message, now)
    out["conditions"] = conditions
    return out
