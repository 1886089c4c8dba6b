"""What a reconcile does with an MPI job's DRA claims as read (decide/claim_steps.py): an uncountable or
shared GPU claim fails the job naming it, a claim object not there yet holds a job with no pods, and the
count is kept in the status and gives the hostfile its slots."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from test_claims_reading import mpi_with_claims

from disttrain.api.observed import ObservedPod
from disttrain.builders.claims import ClaimReading
from disttrain.builders.mpi import SSHKeys
from disttrain.decide.plan import Plan
from disttrain.decide.reconcile import reconcile

NOW = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
CLAIM = {"name": "gpus", "resourceClaimTemplateName": "two-gpus"}


def step(reading: ClaimReading, status: dict[str, Any] | None = None, pods: list[ObservedPod] = (),  # type: ignore[assignment]
         gpus: int | None = None) -> Plan:
    state = mpi_with_claims(4, CLAIM, status=status)
    assert state.spec.mpi is not None
    spec = dataclasses.replace(state.spec, mpi=dataclasses.replace(state.spec.mpi, claimed_gpus=gpus))
    keys = SSHKeys("k", "ssh-ed25519 AAAA k")
    return reconcile(dataclasses.replace(state, spec=spec, claims=reading), list(pods), NOW, keys)


def test_an_uncountable_claim_fails_the_job_with_its_words_and_a_warning() -> None:
    plan = step(ClaimReading(trouble="spec.mpi.worker's claims: devices.requests[0] (gpu): allocationMode All"))
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "InvalidSpec"
    assert "allocationMode All" in plan.status["message"] and not plan.create
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "InvalidSpec")]


def test_a_job_whose_claim_template_is_not_there_yet_waits_saying_which_and_looks_again() -> None:
    plan = step(ClaimReading(missing="ResourceClaimTemplate two-gpus"))
    assert not plan.create and plan.status["reason"] == "WaitingForClaims"
    assert plan.status["message"] == ("waiting for ResourceClaimTemplate two-gpus, which its workers' "
                                      "resourceClaims name, to be created")
    assert plan.requeue_after == 5.0
    again = step(ClaimReading(missing="ResourceClaimTemplate two-gpus"), status=plan.status)
    assert not again.events, "said once"


def test_counted_gpus_are_kept_in_the_status_and_become_the_hostfiles_slots() -> None:
    plan = step(ClaimReading(gpus=2), gpus=2)
    assert plan.status["claimedGPUsPerWorker"] == 2
    hostfile = next(o for o in plan.create if o["kind"] == "ConfigMap")["data"]["hostfile"]
    assert hostfile.count("slots=2") == 4
