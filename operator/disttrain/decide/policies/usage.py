"""Where a job's GPU-seconds went: `status.usage` (issue 46).

What a job holds: each pod's GPUs (nvidia.com/gpu, or the GPUs an MPI worker's DRA claims give it,
control/claims.py) from the moment it is bound to a node until it ends (a terminal phase: the
kubelet frees its devices and the scheduler stops counting it) or is gone (a pod being deleted holds
them until then). A job without GPUs is counted in CPU cores requested, the same way.

The held seconds are split by what the job was doing with them, one use at a time:
- training: Running, its training moving past any step it had reached before;
- redone: Running, a new attempt not yet past the furthest step (or epoch) an earlier attempt
  reached: the steps done again after a restart, its restore and first compilation included;
- waiting: Pending or Restarting: pods up while the others are made, scheduled or torn down;
- checkpoint: a stop's checkpoint hold (status.checkpoint: suspend, eviction or drain waiting for
  the training to save);
- stalled: found stalled (decide/policies/stall.py), from the training's last new step on;
- other: held by a job Queued, Suspended or finished (its last pods going).

While a reporting job's step stands, the seconds since its last new step are unsettled: told as
training (or redone) at the next new step, split at that report's time, or as stalled if the stall is
found first. No use ever goes down (the per-job counters: Prometheus reads a drop as a reset).

How it is counted without writes of its own: `status.usage.countedAt` is when the totals were
counted up to, and `state` the use the held seconds count as from then on. Each pass counts the
seconds since then, from each pod's own times (scheduled_at, ended_at: exact however late the
pass), and moves `countedAt` to now. The status goes out with a write the pass makes anyway, at a
change of use no other field shows (not training/redone: it rides with the progress write), within
5 s of a pod gone (it can't be counted later: the index no longer has it), and 5 minutes (stalled)
or 30 minutes (holding GPUs) after the last count written (decide/usage_steps.py); any other
pass's count is made again by the next from the same status. So the totals are exact whenever
written, and an operator restarted carries on from them. Lost: what a pod held between the last
count written and its going, when its going was never seen (the operator down, a watch's gap).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from disttrain.api.constants import GPU_RESOURCE
from disttrain.api.crd_usage import USES
from disttrain.api.observed import ObservedPod
from disttrain.api.spec import JobSpec, ReplicaType
from disttrain.api.status import FINISHED, Phase
from disttrain.builders.resources import pod_requests, template_gpus

CPU = "cpu"
STEPPING = ("training", "redone")  # the uses whose seconds wait to be told from a stall (unsettledSeconds)


def units_by_type(spec: JobSpec, claimed: Any = None) -> tuple[str, dict[str, float]]:
    """The resource a job is counted in, and how much of it a pod of each replica type holds:
    nvidia.com/gpu when any pod asks for one (its own or, for MPI workers, through DRA claims: as
    read this pass, else as kept in status.claimedGPUsPerWorker, `claimed`, which a finished job's
    pass doesn't read again), else CPU cores requested."""
    gpus = {rtype: float(template_gpus(r.template)) for rtype, r in spec.replicas.items()}
    mpi = spec.mpi
    kept = claimed if isinstance(claimed, int) and not isinstance(claimed, bool) and 0 < claimed <= 1024 else None
    if mpi is not None and (mpi.claimed_gpus or kept) and not gpus.get(ReplicaType.WORKER):
        gpus[ReplicaType.WORKER] = float(mpi.claimed_gpus or kept or 0)
    if any(gpus.values()):
        return GPU_RESOURCE, gpus
    return CPU, {rtype: float(pod_requests(r.template).get(CPU, 0)) for rtype, r in spec.replicas.items()}


def held_seconds(pod: ObservedPod, units: float, start: float | None, end: float) -> float:
    """What `pod` held between `start` (None: since it was scheduled) and `end`, in unit-seconds."""
    if not units or not pod.scheduled:
        return 0.0
    begin = pod.scheduled_at if start is None else max(start, pod.scheduled_at or start)
    if begin is None:
        return 0.0  # bound, with no time to count from, and nothing counted before
    until = end if pod.ended_at is None else min(end, pod.ended_at)
    return max(0.0, until - begin) * units


def held_between(pods: Iterable[ObservedPod], units: Mapping[str, float], start: float | None, end: float) -> float:
    return sum(held_seconds(p, units.get(p.replica_type, 0.0), start, end) for p in pods)


def use_of(phase: Phase, checkpoint: bool, stalled: bool, redoing: bool) -> str:
    """What the held seconds count as from now on."""
    if phase is Phase.RUNNING:
        if checkpoint:
            return "checkpoint"
        if stalled:
            return "stalled"
        return "redone" if redoing else "training"
    if phase in (Phase.PENDING, Phase.RESTARTING):
        return "checkpoint" if checkpoint else "waiting"
    return "other"


def position_key(progress: Mapping[str, Any]) -> tuple[int, int] | None:
    """A reported position, ordered: (epoch, step), either -1 when not reported; None for neither."""
    epoch, step = progress.get("epoch"), progress.get("step")
    if epoch is None and step is None:
        return None
    if any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in (epoch, step)):
        return None  # not what the schema lets through: a stored object's that skipped it
    return (epoch if epoch is not None else -1, step if step is not None else -1)


def counted(resource: str, seconds: Mapping[str, float], unsettled: float, counted_at: str, use: str,
            reached: Mapping[str, Any] | None) -> dict[str, Any]:
    """`status.usage` with these totals: each use to a tenth of a second, and the allocated total
    their sum with the unsettled seconds (so the split always adds up), in hours and as goodput."""
    split = {name: round(seconds.get(name, 0.0), 1) for name in USES}
    waiting = round(unsettled, 1)
    allocated = round(sum(split.values()) + waiting, 1)
    out: dict[str, Any] = {
        "resource": resource, "allocatedSeconds": allocated,
        "seconds": {name: value for name, value in split.items() if value},
        "goodputPercent": round(100 * split["training"] / allocated) if allocated else 0,
        "countedAt": counted_at, "state": use,
    }
    if waiting:
        out["unsettledSeconds"] = waiting
    out["gpuHours" if resource == GPU_RESOURCE else "cpuHours"] = round(allocated / 3600, 2)
    if reached:
        out["reached"] = dict(reached)
    return out


def finished_without_usage(phase: Phase, usage: Mapping[str, Any] | None) -> bool:
    """A job finished before the operator counted usage (an upgrade): left without one, rather than
    one write per such job for a count that would start at its end."""
    return usage is None and phase in FINISHED
