"""The status a job keeps so that an operator restarted midway goes on as begun: which pods it
deleted (`deletedPods`), the old pods a new attempt's pods wait out (`previousPods`:
decide/name_reuse_steps.py), and the GPUs its MPI workers' DRA claims give them
(`claimedGPUsPerWorker`: decide/claim_steps.py)."""

from __future__ import annotations

from disttrain.api.crd_spec import Schema, int_field, string_field

DELETED_PODS: Schema = {
    "type": "array", "items": {"type": "string"},
    "description": "UIDs of the pods the operator's last decisions deleted: kept in the status that announces the "
                   "deletes, so an operator restarted before it made them makes them without counting a failure twice.",
}


PREVIOUS_PODS: Schema = {
    "type": "object",
    "description": "Old pods holding the names of pods still to be made (a whole-job restart's last attempt's, a "
                   "suspended or evicted job's, an earlier job's of the same name): empty while they go, then goneAt; "
                   "the new pods are made the operator's --name-reuse-seconds after it, when no cached DNS answer "
                   "names an old pod's address any more. Removed once they are made.",
    "properties": {"goneAt": string_field("When the last of them was found gone.", format="date-time")},
}


CLAIMED_GPUS_SCHEMA: Schema = int_field(
    "GPUs each MPI worker gets through its DRA resourceClaims, as the operator counted them from the claims' "
    "objects: its slots when neither spec.mpi.slotsPerWorker nor nvidia.com/gpu says.", minimum=0)
