"""The chart's ValidatingAdmissionPolicies, their CEL evaluated here as the API server would
(cel-python) on the updates a user could make; tests/integration/test_kueue.py checks the same on a
real API server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel

TEMPLATES = Path(__file__).resolve().parents[2] / "charts" / "disttrain-operator" / "templates"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def policy(template: str) -> dict[str, Any]:
    """The template's ValidatingAdmissionPolicy, its Helm directives (names, labels) dropped."""
    text = re.sub(r"\{\{-? /\*.*?\*/ -?\}\}", "", (TEMPLATES / template).read_text(), flags=re.S)
    plain = "\n".join(line for line in text.splitlines() if "{{" not in line)
    return next(d for d in yaml.safe_load_all(plain) if d and d["kind"] == "ValidatingAdmissionPolicy")


def admitted(template: str, old: dict[str, Any], new: dict[str, Any]) -> bool:
    env = celpy.Environment()
    activation: dict[str, Any] = {"oldObject": json_to_cel(old), "object": json_to_cel(new)}
    spec = policy(template)["spec"]
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = env.program(env.compile(variable["expression"])).evaluate(
            {**activation, "variables": json_to_cel(variables)})
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    return all(bool(env.program(env.compile(v["expression"])).evaluate(activation)) for v in spec["validations"])


def job(phase: str, queue: str | None, suspend: bool | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "mnist", "labels": {QUEUE_LABEL: queue} if queue else {"team": "ml"}},
            "spec": {"runPolicy": {} if suspend is None else {"suspend": suspend}}, "status": {"phase": phase}}


@pytest.mark.parametrize(("old", "new", "allowed"), [
    (job("Running", "q"), job("Running", None), False),  # dropped from a running job
    (job("Running", None), job("Running", "q"), False),  # added to one
    (job("Queued", "q"), job("Queued", "other"), True),  # waiting: it may move
    (job("Suspended", "q", True), job("Suspended", None, True), True),  # suspended: it may leave
    (job("Running", "q", True), job("Running", None, True), True),  # suspended, in its checkpoint hold
    # Issue 43: suspended and dropped in one update, a preempted job in its checkpoint hold kept its
    # evicted Workload's quota for ever; suspend first, then change the label.
    (job("Running", "q", False), job("Running", None, True), False),
    (job("Running", "q"), job("Running", "other", True), False),
    (job("Running", "q", True), job("Running", "other", False), False),  # nor resume and move at once
    (job("Running", "q"), job("Running", "q", True), True),  # a suspend alone
])
def test_the_queue_label_changes_only_while_the_job_waits_or_was_suspended_before(
        old: dict[str, Any], new: dict[str, Any], allowed: bool) -> None:
    assert admitted("queue-label-policy.yaml", old, new) is allowed
