"""Fuzzed jobs on the pure half (issue 12, item 6, the cheap part): specs drawn from the CRD's own
`spec` schema (the API server's structural defaults filled in, as it stores them), pods in any
state. `parse_spec` accepts or refuses with a SpecError; `reconcile` never raises, always leaves a
phase, and the pods it builds get no privilege their template didn't ask for (item 7)."""

from __future__ import annotations

import datetime
import os
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import SpecError, parse_spec
from disttrain.api.spec import JobSpec
from disttrain.api.status import Phase
from disttrain.control.ssh_keys import generate_ssh_keys
from disttrain.decide import dispatch_steps
from disttrain.decide.passes import JobState
from disttrain.decide.reconcile import reconcile
from jobfuzz import specs

REF = JobRef("fuzz", "ml", "uid-1")
KEYS = generate_ssh_keys("fuzz")
EXAMPLES = int(os.environ.get("DISTTRAIN_FUZZ_EXAMPLES", "300"))
PHASES = ["Pending", "Running", "Succeeded", "Failed", "Unknown"]


@st.composite
def pods_of(draw: st.DrawFn, spec: JobSpec) -> list[ObservedPod]:
    names = [(rtype, i) for rtype, r in spec.replicas.items() for i in range(min(r.replicas, 6))]
    chosen = draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    return [ObservedPod(name=f"fuzz-{rtype}-{i}", uid=f"u-{rtype}-{i}-{draw(st.integers(0, 2))}",
                        owner_uid=draw(st.sampled_from(["uid-1", "uid-1", "uid-0"])), replica_type=rtype, index=i,
                        phase=draw(st.sampled_from(PHASES)), ready=draw(st.booleans()), terminating=draw(st.booleans()),
                        exit_code=draw(st.none() | st.integers(1, 255)), reason=draw(st.none() | st.just("Evicted")),
                        container_restarts=draw(st.integers(0, 5)), scheduled=draw(st.booleans()),
                        unschedulable=draw(st.none() | st.just("0/4 nodes")),
                        stuck=draw(st.none() | st.just("ImagePullBackOff: container main: x")))
            for rtype, i in chosen]


statuses = st.fixed_dictionaries({}, optional={
    "phase": st.sampled_from([p.value for p in Phase]),
    "operatorRestarts": st.integers(0, 10),
    "startTime": st.sampled_from(["2026-11-22T11:00:00Z", "2026-11-22T11:59:59.123456Z"]),
    "completionTime": st.just("2026-11-22T11:30:00Z"),
    "deletedPods": st.lists(st.sampled_from(["u-worker-0-0", "u-chief-0-1", "x"]), max_size=3),
    "gang": st.fixed_dictionaries({"provider": st.sampled_from(["Kubernetes", "SchedulerPlugins", "Volcano"])}),
})
NOW = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)
# Pod fields that grant privileges: a built pod has them only as its template wrote them.
PRIVILEGED = ("hostNetwork", "hostPID", "hostIPC", "automountServiceAccountToken", "serviceAccountName",
              "securityContext")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=specs, data=st.data())
def test_any_schema_valid_spec_is_parsed_or_refused_and_reconciled(raw: dict[str, Any], data: st.DataObject) -> None:
    try:
        spec = parse_spec(raw)
    except SpecError:
        event("refused by parse_spec")
        return
    event(f"{spec.framework.value}, {spec.total_pods} pods")
    status = data.draw(statuses)
    plan = reconcile(JobState(REF, 1, spec, status), data.draw(pods_of(spec)), NOW, KEYS)
    if dispatch_steps.managed_elsewhere(spec):  # spec.managedBy: another controller's job, no pod made here
        event("managed elsewhere")
        assert not plan.create and not plan.delete
        return
    assert plan.status["phase"] in {p.value for p in Phase}
    for pod in (o for o in plan.create if o["kind"] == "Pod"):
        rtype = pod["metadata"]["labels"]["disttrain.dev/replica-type"]
        template = spec.replicas[rtype].template.get("spec") or {}
        assert no_added_privilege(template, pod["spec"]), pod["metadata"]["name"]


def no_added_privilege(template: dict[str, Any], built: dict[str, Any]) -> bool:
    if any(built.get(k) != template.get(k) for k in PRIVILEGED):
        return False
    written = template.get("containers") or []
    if len(written) != len(built.get("containers") or []):
        return False
    for mine, theirs in zip(built.get("containers") or [], written, strict=True):
        if mine.get("securityContext") != theirs.get("securityContext"):
            return False
    # Volumes the operator adds are the job's own Secret and ConfigMap (MPI), never a host path.
    added = [v for v in built.get("volumes") or [] if v not in (template.get("volumes") or [])]
    return all(set(v) - {"name"} <= {"secret", "configMap"} for v in added)
