"""The schema of `status.usage`: where the job's GPU-seconds went (decide/policies/usage.py)."""

from __future__ import annotations

from disttrain.api.crd_spec import Schema, enum_field, int_field, string_field

# The uses a job's held seconds are split by, in the order `disttrain progress` shows them.
USES = ("training", "redone", "waiting", "checkpoint", "stalled", "other")
_USE_WORDS = {
    "training": "Running, past any step reached before",
    "redone": "Running again after a restart, short of the furthest step reached before",
    "waiting": "Pending or Restarting: pods up while the others are made, scheduled or torn down",
    "checkpoint": "a stop's checkpoint hold (status.checkpoint)",
    "stalled": "Running and found stalled, from the training's last new step on (a restart for it is waiting, "
               "then redone)",
    "other": "held by a job queued, suspended or finished (its last pods going)",
}


def _count(what: str) -> Schema:
    return {"type": "integer", "format": "int64", "minimum": 0, "description": what}


def _seconds(what: str) -> Schema:
    return {"type": "number", "minimum": 0, "description": what}


def usage_status_schema() -> Schema:
    return {
        "type": "object",
        "description": "What the job's pods have held of the node's GPUs (nvidia.com/gpu, DRA claims), or CPU cores "
                       "for a job without GPUs, from each pod's scheduling until it ended or went, and what for "
                       "(docs/api.md, Usage and goodput). Counted with the status writes the job makes anyway: as of "
                       "countedAt.",
        "properties": {
            "resource": string_field("What is counted: nvidia.com/gpu, or cpu for a job without GPUs."),
            "allocatedSeconds": _seconds("Resource-seconds held in all (GPU-seconds, or CPU core-seconds): the "
                                         "sum of seconds and unsettledSeconds."),
            "gpuHours": _seconds("allocatedSeconds in hours, for a GPU job."),
            "cpuHours": _seconds("allocatedSeconds in hours, for a job without GPUs."),
            "goodputPercent": int_field("seconds.training / allocatedSeconds, in percent.", minimum=0, maximum=100),
            "seconds": {"type": "object", "description": "allocatedSeconds split by use (a use with none is left out).",
                        "properties": {use: _seconds(words) for use, words in _USE_WORDS.items()}},
            "unsettledSeconds": _seconds("Resource-seconds held since the training's last new step, Running: "
                                         "training (or redone) once it reports a new one, stalled if it is found "
                                         "stalled first. Part of allocatedSeconds, in no use yet."),
            "countedAt": string_field("When the totals were counted up to.", format="date-time"),
            "state": enum_field("What the held seconds count as since countedAt.", list(USES)),
            "reached": {"type": "object", "description": "The furthest position the training reported, over all "
                        "its attempts: an attempt short of it is redoing steps.",
                        "properties": {"epoch": _count("Epochs done."), "step": _count("Steps done.")}},
        },
    }
