"""Kueue TAS, decided purely: a replica's topology annotations become its podSet's topologyRequest,
and the pods of a podSet TAS placed wait behind Kueue's gate, findable by its ungater."""

from __future__ import annotations

import datetime
from typing import Any

from disttrain.api import topology
from disttrain.api.objects import JobRef
from disttrain.api.parse import parse_spec
from disttrain.api.spec import JobSpec
from disttrain.decide import queueing
from disttrain.decide.passes import JobState
from disttrain.decide.queueing import Flavor, ObservedWorkload, QueueState, observe_workload
from disttrain.decide.reconcile import reconcile
from manifests import replica, tf_job

REF = JobRef("tas", "ml", "uid-1")
NOW = datetime.datetime(2026, 11, 25, 12, 0, 0, tzinfo=datetime.UTC)


def annotated(n: int, **annotations: str) -> dict[str, Any]:
    spec = replica(n, gpus=2)
    spec["template"]["metadata"] = {"annotations": {topology.PREFIX + k.replace("_", "-"): v
                                                    for k, v in annotations.items()}}
    return spec


JOB = tf_job("tas", None, chief=annotated(1, podset_required_topology="kubernetes.io/hostname"),
             worker=annotated(4, podset_required_topology="example.com/rack"))
SPEC = parse_spec(JOB["spec"])


def test_the_annotations_become_each_podsets_topology_request() -> None:
    sets = {s["name"]: s for s in queueing.pod_sets(SPEC)}
    assert sets["worker"]["topologyRequest"] == {"required": "example.com/rack",
                                                 "podIndexLabel": "disttrain.dev/replica-index"}
    assert sets["chief"]["topologyRequest"]["required"] == "kubernetes.io/hostname"
    plain = parse_spec(tf_job("p", None, worker=replica(2))["spec"])
    assert "topologyRequest" not in queueing.pod_sets(plain)[0]


def test_preferred_unconstrained_slices_and_groups_as_kueue_reads_them() -> None:
    index = "disttrain.dev/replica-index"
    assert topology.topology_request({topology.PREFERRED: "rack"}, index) == {"preferred": "rack",
                                                                                "podIndexLabel": index}
    assert topology.topology_request({topology.UNCONSTRAINED: "true"}, index) == {"unconstrained": True,
                                                                                    "podIndexLabel": index}
    sliced = topology.topology_request({topology.REQUIRED: "block", topology.SLICE_REQUIRED: "rack",
                                        topology.SLICE_SIZE: "2", topology.GROUP: "g"}, index)
    assert sliced == {"required": "block", "podSetSliceRequiredTopology": "rack", "podSetSliceSize": 2,
                      "podSetGroupName": "g", "podIndexLabel": index}
    assert topology.topology_request({topology.GROUP: "g"}, index) is None


def placed(*podsets: str, spec: JobSpec = SPEC) -> ObservedWorkload:
    sets = queueing.pod_sets(spec)
    return ObservedWorkload(
        name="disttrainjob-tas-1a2b3", uid="w", owner_uid="uid-1", podsets_hash=queueing.podsets_hash(sets),
        active=True, conditions={t: {"type": t, "status": "True"} for t in ("QuotaReserved", "Admitted")},
        assignments={s["name"]: {"nvidia.com/gpu": "tas"} for s in sets}, cluster_queue="cq",
        topology_placed=frozenset(podsets))


def pods(workload: ObservedWorkload, spec: JobSpec = SPEC) -> dict[str, dict[str, Any]]:
    state = QueueState("gpus", workload, {"tas": Flavor({"pool": "tas"})})
    plan = reconcile(JobState(REF, 1, spec, {"phase": "Queued"}, queue=state), [], NOW)
    return {o["metadata"]["name"]: o for o in plan.create if o["kind"] == "Pod"}


def test_the_pods_of_a_placed_podset_wait_for_kueues_ungater() -> None:
    made = pods(placed("chief", "worker"))
    worker = made["tas-worker-3"]
    assert worker["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
    assert worker["spec"]["nodeSelector"] == {"pool": "tas"}, "the flavor's labels; the domain is Kueue's to add"
    assert worker["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == "disttrainjob-tas-1a2b3"
    assert worker["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "worker"
    assert worker["metadata"]["labels"]["disttrain.dev/replica-index"] == "3"
    assert worker["metadata"]["annotations"][topology.REQUIRED] == "example.com/rack"


def test_a_podset_placed_unasked_is_marked_unconstrained_and_one_not_placed_is_not_gated() -> None:
    spec = parse_spec(tf_job("tas", None, chief=replica(1), worker=annotated(4, podset_required_topology="rack"))
                      ["spec"])
    made = pods(placed("chief", "worker", spec=spec), spec)
    assert made["tas-chief-0"]["metadata"]["annotations"][topology.UNCONSTRAINED] == "true"
    made = pods(placed("worker", spec=spec), spec)
    assert "schedulingGates" not in made["tas-chief-0"]["spec"]


def test_the_assignment_is_read_per_podset() -> None:
    seen = observe_workload({"metadata": {"name": "w"}, "status": {"admission": {"podSetAssignments": [
        {"name": "worker", "flavors": {"cpu": "tas"}, "topologyAssignment": {"levels": ["rack"], "slices": []}},
        {"name": "chief", "flavors": {"cpu": "tas"}}]}}})
    assert seen.topology_placed == {"worker"}
