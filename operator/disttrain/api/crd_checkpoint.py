"""The schema of a job's checkpoint status: the request a held stop waits on (`status.checkpoint`)
and the last checkpoint the training confirmed (`status.lastCheckpoint`); decide/checkpoint_steps.py
writes both."""

from __future__ import annotations

from disttrain.api.crd_spec import Schema, string_field


def checkpoint_status_schema() -> Schema:
    return {
        "type": "object",
        "description": "A checkpoint the operator asked for before it stops the pods (runPolicy."
                       "checkpointGraceSeconds): the stop waits for its confirmation or its deadline.",
        "properties": {
            "request": string_field("The request's id: the pods read it from their checkpoint-request file."),
            "reason": string_field("Why the job stops: Evicted, Suspended, Disrupted (a whole-job restart "
                                        "after a pod was ended from outside)."),
            "requestedAt": string_field("When the operator asked.", format="date-time"),
            "deadline": string_field("When it stops the pods without a confirmation.", format="date-time"),
        },
    }


def last_checkpoint_schema() -> Schema:
    return {
        "type": "object",
        "description": "The last checkpoint the training confirmed to the operator.",
        "properties": {
            "request": string_field("The request it answered."),
            "step": {"type": "integer", "format": "int64", "minimum": 0,
                     "description": "The step it holds: a resumed training continues from there."},
            "path": string_field("Where it is, as the training names it."),
            "confirmedAt": string_field("When the confirmation arrived (the operator's clock).", format="date-time"),
            "waitedSeconds": {"type": "number", "description": "From the request to the confirmation."},
        },
    }
