"""Fuzzed DistTrainJobs sent to the real API server (issue 12, item 6).

Manifests drawn from the CRD's own `spec` schema (tests/jobfuzz.py), some pushed outside it (a
field of the wrong type, huge or negative numbers, ports 0 and 65536, thousands of replicas,
unicode, empty templates) and named anything from one character to 253. Each is refused by the
API server with a message, or accepted and then run or failed by the operator with a message. The
operator never crashes, never logs a traceback, and never leaves an accepted job without a phase.
A job of more than 8 pods is submitted suspended: the fuzz is about input, not about scheduling
thousands of pods on four fake nodes."""

from __future__ import annotations

import copy
import json
import os
import time
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st
from kubernetes import client

from jobfuzz import specs
from support import Cluster, OperatorProcess, wait_for

FULL = os.environ.get("DISTTRAIN_CHAOS") == "full"
EXAMPLES = int(os.environ.get("DISTTRAIN_FUZZ_API_EXAMPLES", "300" if FULL else "40"))
MAX_RUN_PODS = 8
# The quick run's draws, pinned. Derandomized alone, Hypothesis seeds them from a digest of the test
# that changed with what else the session collected: the clean-clone run of the DRA change drew 40
# that the API server refused but for 3 regressions (`pytest tests -k fuzzed` drew them; this file
# alone drew 10 accepted), where the seed draws 13 accepted either way.
SEED = 20261126
ODD_VALUES = ["x", "", "ü" * 300, -1, 0, 65536, 2**31, 2**63, 10_000, 1.5, True, None, [], {}, ["a"], {"a": 1}]


def leaf_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in leaf_paths(v, (*path, k))] + [path]
    if isinstance(value, list) and value:
        return [p for i, v in enumerate(value) for p in leaf_paths(v, (*path, i))] + [path]
    return [path]


@st.composite
def outside_schema(draw: st.DrawFn, spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with one field (or object) replaced by a value of the wrong kind or size."""
    spec = copy.deepcopy(spec)
    paths = [p for p in leaf_paths(spec) if p]
    if not paths:
        return spec
    path = draw(st.sampled_from(paths))
    target: Any = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = draw(st.sampled_from(ODD_VALUES))
    return spec


good_names = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
names = st.one_of(
    good_names,
    st.integers(1, 253).map(lambda n: "n" * n),
    st.sampled_from(["UPPER", "ünïcode", "-dash", "dot.ted", "a" * 54, "a" * 55, "a" * 60]),
)
# Three kinds in equal parts, so that about half are accepted whatever the draw: the CI run of
# 40 once drew 38 refusals from a single mix of odd names and odd fields, and tested little.
manifests = st.one_of(
    st.tuples(good_names, specs),
    st.tuples(names, specs),
    st.tuples(good_names, specs.flatmap(outside_schema)),
)


def regression(worker_template: dict[str, Any], **run_policy: Any) -> tuple[str, dict[str, Any]]:
    spec: dict[str, Any] = {"tensorflow": {"worker": {"replicas": 1, "template": worker_template}}}
    if run_policy:
        spec["runPolicy"] = run_policy
    return "regression", spec


TF = {"name": "tf", "image": "disttrain/tensorflow:2.21"}
# Inputs that once went wrong, kept as fixed cases (run before the drawn ones, every time):
REGRESSIONS = [
    # a PriorityClass that doesn't exist: every pod create refused (403), retried with tracebacks
    regression({"spec": {"containers": [TF]}}, scheduling={"priorityClassName": "no-such-class"}),
    # templates the pod API refuses, accepted by the CRD and failed only later: no spec, no
    # container, two containers of one name
    regression({"metadata": {"labels": {"a": "b"}}}),
    regression({"spec": {"containers": []}}),
    regression({"spec": {"containers": [TF, TF]}}),
    # a quantity the CRD's int-or-string schema accepts and the pod API can't decode (400, not 422):
    # retried with tracebacks
    regression({"spec": {"containers": [{**TF, "resources": {"limits": {"cpu": "a lot"}}}]}}),
    # failed at once (a fractional GPU) and deleted by its TTL before the test could see a phase
    regression({"spec": {"containers": [{**TF, "resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}},
               ttlSecondsAfterFinished=0),
]


def pinned(test: Any) -> Any:
    return test if FULL else seed(SEED)(test)


def with_regressions(test: Any) -> Any:
    for case in REGRESSIONS:
        test = example(drawn=case)(test)
    return test


def total_replicas(spec: Any) -> int:
    total = 0
    for framework in ("tensorflow", "mpi"):
        section = spec.get(framework) if isinstance(spec, dict) else None
        for replica in (section or {}).values() if isinstance(section, dict) else ():
            count = replica.get("replicas", 1) if isinstance(replica, dict) else 1
            total += count if isinstance(count, int) and not isinstance(count, bool) else 1
    return total


def test_fuzzed_manifests_are_refused_with_a_message_or_get_a_phase(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    ns = namespace
    log_start = len(operator.log())
    accepted: dict[str, dict[str, Any]] = {}
    refused: Counter[str] = Counter()
    seq = iter(range(1_000_000))

    # The quick run (in make test) draws the same examples every time; make chaos draws new ones.
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not FULL,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(drawn=manifests)
    @pinned
    @with_regressions
    def submit(drawn: tuple[str, dict[str, Any]]) -> None:
        raw_name, spec = drawn
        prefix = f"f{next(seq)}-"
        name = (prefix + raw_name)[:max(len(raw_name), len(prefix) + 1)]
        if total_replicas(spec) > MAX_RUN_PODS and isinstance(spec, dict):
            run_policy = spec.get("runPolicy")
            if isinstance(run_policy, dict):
                run_policy["suspend"] = True
            elif "runPolicy" not in spec:
                spec["runPolicy"] = {"suspend": True}
        body = {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name}, "spec": spec}
        try:
            created = cluster.custom.create_namespaced_custom_object("disttrain.dev", "v1", ns, "disttrainjobs", body)
        except client.ApiException as err:
            assert err.status in (400, 409, 413, 422), f"{err.status} for {json.dumps(body)[:500]}: {err.body}"
            message = json.loads(err.body or "{}").get("message", "")
            assert message, f"refused without a message: {err.body}"
            refused[str(err.status)] += 1
            return
        accepted[created["metadata"]["name"]] = body

    submit()

    def phases() -> tuple[dict[str, dict[str, Any]]]:
        items = cluster.custom.list_namespaced_custom_object("disttrain.dev", "v1", ns, "disttrainjobs")["items"]
        statuses = {j["metadata"]["name"]: j.get("status") or {} for j in items}
        for gone in set(accepted) - set(statuses):
            # A job that finished at once is deleted by its own ttlSecondsAfterFinished (0 to a few
            # seconds): the operator wrote its phase first (its log says which), the list can't show it.
            run_policy = accepted[gone]["spec"].get("runPolicy")
            assert isinstance(run_policy, dict) and "ttlSecondsAfterFinished" in run_policy, f"{gone} vanished"
            statuses[gone] = {"phase": "DeletedByTTL", "message": "ttlSecondsAfterFinished"}
        # spec.managedBy naming another controller: its job, whose status is not ours to write.
        others = {n for n, body in accepted.items()
                  if body["spec"].get("managedBy") not in (None, "disttrain.dev/operator", "kueue.x-k8s.io/multikueue")}
        for n in others:
            statuses[n] = {"phase": "ManagedElsewhere", "message": "spec.managedBy"}
        no_phase = {n: accepted[n] for n in accepted if not statuses.get(n, {}).get("phase")}
        assert not no_phase, f"{len(no_phase)} accepted jobs have no phase: {json.dumps(no_phase)[:3000]}"
        return (statuses,)
    started = time.monotonic()
    (statuses,) = wait_for(phases, 120, "a phase on every accepted job", interval=1)
    assert len(accepted) >= EXAMPLES // 10, f"only {len(accepted)} of {EXAMPLES} accepted: the fuzz tests little"
    outcomes = Counter(s["phase"] for s in statuses.values())
    failed_silently = {n: s for n, s in statuses.items() if s["phase"] == "Failed" and not s.get("message")}
    print(f"\nfuzz: {EXAMPLES} generated and {len(REGRESSIONS)} fixed cases, {sum(refused.values())} refused "
          f"by the API server {dict(refused)}, "
          f"{len(accepted)} accepted; phases {dict(outcomes)} within {time.monotonic() - started:.0f}s; "
          f"failed by the operator: {outcomes.get('Failed', 0)}; operator crashes: "
          f"{int(operator.proc is None or operator.proc.poll() is not None)}")
    reasons = Counter(f"{s.get('reason')}: {str(s.get('message'))[:400]}" for s in statuses.values()
                      if s["phase"] == "Failed")
    print("failed by the operator, by message:\n  " + "\n  ".join(f"{n} x {m}" for m, n in reasons.most_common()))
    assert not failed_silently, failed_silently
    assert operator.proc is not None and operator.proc.poll() is None, "the operator died"
    log = operator.log()[log_start:]
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:log.index("Traceback") + 3000]
