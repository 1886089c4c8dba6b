"""Gang scheduling: the groups per provider, who joins them, which provider, and the job's life
with a gang (chosen once, released when finished, suspended or restarted; Volcano admits first)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import parse_spec
from disttrain.api.spec import Gang, GangProvider, JobSpec
from disttrain.builders import gang
from disttrain.builders.desired import job_pod, supporting_objects
from disttrain.builders.gang import GroupStatus
from disttrain.decide.passes import JobState
from disttrain.decide.reconcile import reconcile
from manifests import mpi_job, replica, tf_job

REF = JobRef("mnist", "ml", "uid-1")
NOW = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)
ALL = frozenset(GangProvider) - {GangProvider.AUTO}
# What a 1.36 cluster with every gang scheduler serves (a 1.37 one: scheduling.k8s.io/v1beta1 instead).
SERVED_136 = frozenset({"scheduling.k8s.io/v1alpha2", "scheduling.x-k8s.io/v1alpha1", "scheduling.volcano.sh/v1beta1"})


def with_gang(job: dict[str, Any], **settings: Any) -> dict[str, Any]:
    job["spec"].setdefault("runPolicy", {}).setdefault("scheduling", {})["gang"] = settings
    return job


def six_gpu_workers(**settings: Any) -> JobSpec:
    return parse_spec(with_gang(tf_job("mnist", None, worker=replica(6, gpus=1, cpu="2")), **settings)["spec"])


def test_kubernetes_group_is_a_workload_then_a_podgroup_naming_it() -> None:
    spec = six_gpu_workers()
    assert spec.run_policy.scheduling.gang is not None
    workload, group = gang.objects(REF, spec, spec.run_policy.scheduling.gang, GangProvider.KUBERNETES,
                                   "scheduling.k8s.io/v1alpha2")
    assert (workload["kind"], group["kind"]) == ("Workload", "PodGroup")
    assert workload["apiVersion"] == group["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    assert workload["spec"]["podGroupTemplates"] == [{"name": "gang", "schedulingPolicy": {"gang": {"minCount": 6}}}]
    assert workload["spec"]["controllerRef"] == {"apiGroup": "disttrain.dev", "kind": "DistTrainJob", "name": "mnist"}
    template = {"workload": {"workloadName": "mnist", "podGroupTemplateName": "gang"}}
    assert group["spec"] == {"podGroupTemplateRef": template, "schedulingPolicy": {"gang": {"minCount": 6}}}
    assert group["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    pod = job_pod(REF, spec, PodKey("worker", 3), GangProvider.KUBERNETES)
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "mnist"}
    assert pod["spec"]["schedulerName"] == "default-scheduler"


def test_kubernetes_137_names_its_workload_in_workload_ref_and_carries_the_pods_priority() -> None:
    job = with_gang(tf_job("mnist", None, worker=replica(6, gpus=1, cpu="2")))
    job["spec"]["runPolicy"]["scheduling"]["priorityClassName"] = "high"
    spec = parse_spec(job["spec"])
    assert spec.run_policy.scheduling.gang is not None
    workload, group = gang.objects(REF, spec, spec.run_policy.scheduling.gang, GangProvider.KUBERNETES,
                                   "scheduling.k8s.io/v1beta1")
    assert workload["apiVersion"] == group["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert workload["spec"]["podGroupTemplates"] == [{"name": "gang", "schedulingPolicy": {"gang": {"minCount": 6}}}]
    assert group["spec"] == {"workloadRef": {"workloadName": "mnist", "templateName": "gang"},
                             "schedulingPolicy": {"gang": {"minCount": 6}}, "priorityClassName": "high"}
    pod = job_pod(REF, spec, PodKey("worker", 3), GangProvider.KUBERNETES)
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "mnist"}, "the pod's field is the same in 1.37"


@pytest.mark.parametrize(("served", "api"), [
    ({"scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha3"}, "scheduling.k8s.io/v1beta1"),
    (SERVED_136, "scheduling.k8s.io/v1alpha2"),
])
def test_the_newest_kubernetes_api_served_is_chosen(served: set[str], api: str) -> None:
    assert gang.providers(served) >= {GangProvider.KUBERNETES}
    assert gang.api_version(GangProvider.KUBERNETES, served) == api
    plan = reconcile(state(six_gpu_workers(), served=frozenset(served)), [], NOW)
    assert plan.status["gang"]["apiVersion"] == api
    assert {o["apiVersion"] for o in plan.create if o["kind"] in ("Workload", "PodGroup")} == {api}


def test_scheduler_plugins_group_has_size_resources_and_timeout() -> None:
    spec = six_gpu_workers(timeoutSeconds=30)
    assert spec.run_policy.scheduling.gang is not None
    [group] = gang.objects(REF, spec, spec.run_policy.scheduling.gang, GangProvider.SCHEDULER_PLUGINS)
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 6, "minResources": {"cpu": "12", "nvidia.com/gpu": "6"},
                             "scheduleTimeoutSeconds": 30}
    pod = job_pod(REF, spec, PodKey("worker", 0), GangProvider.SCHEDULER_PLUGINS)
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "mnist"
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_volcano_group_carries_queue_and_priority() -> None:
    job = with_gang(tf_job("mnist", None, worker=replica(2, cpu="500m")))
    job["spec"]["runPolicy"]["scheduling"] |= {"queue": "research", "priorityClassName": "high"}
    spec = parse_spec(job["spec"])
    assert spec.run_policy.scheduling.gang is not None
    [group] = gang.objects(REF, spec, spec.run_policy.scheduling.gang, GangProvider.VOLCANO)
    assert group["spec"] == {"minMember": 2, "minResources": {"cpu": "1"}, "queue": "research",
                             "priorityClassName": "high"}
    pod = job_pod(REF, spec, PodKey("worker", 0), GangProvider.VOLCANO)
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "mnist"
    assert pod["spec"]["schedulerName"] == "volcano"


@pytest.mark.parametrize(("start", "members"), [("WhenWorkersReady", 4), ("Immediately", 5)])
def test_mpi_gang_is_the_pods_created_together(start: str, members: int) -> None:
    job = with_gang(mpi_job("hvd", workers=4, gpus=1))
    job["spec"]["mpi"]["launcherStart"] = start
    spec = parse_spec(job["spec"])
    assert spec.run_policy.scheduling.gang is not None
    assert gang.min_available(spec, spec.run_policy.scheduling.gang) == members
    launcher = job_pod(REF, spec, PodKey("launcher", 0), GangProvider.KUBERNETES)
    assert launcher["spec"]["schedulingGroup"] == {"podGroupName": REF.name}, "it joins the group when it comes"


def test_min_available_and_resources_follow_the_first_members() -> None:
    spec = six_gpu_workers(minAvailable=4)
    assert spec.run_policy.scheduling.gang is not None
    assert gang.min_resources(spec, spec.run_policy.scheduling.gang) == {"cpu": "8", "nvidia.com/gpu": "4"}


@pytest.mark.parametrize(("provider", "served", "scheduler", "chosen"), [
    (GangProvider.AUTO, ALL, None, GangProvider.KUBERNETES),
    (GangProvider.AUTO, ALL, "volcano", GangProvider.VOLCANO),
    (GangProvider.AUTO, ALL, "scheduler-plugins-scheduler", GangProvider.SCHEDULER_PLUGINS),
    (GangProvider.AUTO, {GangProvider.VOLCANO}, None, GangProvider.VOLCANO),
    (GangProvider.AUTO, set(), None, None),
    (GangProvider.SCHEDULER_PLUGINS, ALL, None, GangProvider.SCHEDULER_PLUGINS),
    (GangProvider.VOLCANO, {GangProvider.KUBERNETES}, None, None),
])
def test_choose(provider: GangProvider, served: set[GangProvider], scheduler: str | None,
                chosen: GangProvider | None) -> None:
    assert gang.choose(Gang(provider), served, scheduler) is chosen


def test_a_template_with_another_scheduler_conflicts() -> None:
    job = with_gang(tf_job("mnist", None, worker=replica(2)))
    job["spec"]["tensorflow"]["worker"]["template"]["spec"]["schedulerName"] = "my-scheduler"
    assert "spec.tensorflow.worker.template.spec.schedulerName" in (
        gang.scheduler_conflict(parse_spec(job["spec"]), GangProvider.KUBERNETES) or "")


# -- the job's life with a gang ----------------------------------------------------------------


def pod(name: str, index: int, phase: str = "Pending", scheduled: bool = False,
        unschedulable: str | None = None) -> ObservedPod:
    return ObservedPod(name=f"mnist-{name}-{index}", uid=f"u-{name}-{index}", owner_uid="uid-1", replica_type=name,
                       index=index, phase=phase, ready=phase == "Running", terminating=False, exit_code=None,
                       reason=None, container_restarts=0, scheduled=scheduled, unschedulable=unschedulable)


def state(spec: JobSpec, status: dict[str, Any] | None = None, served: frozenset[str] = SERVED_136,
          group: GroupStatus | None = None) -> JobState:
    return JobState(REF, 1, spec, status or {}, served, group)


def test_the_provider_is_chosen_once_and_said() -> None:
    plan = reconcile(state(six_gpu_workers()), [], NOW)
    assert plan.status["gang"] == {"provider": "Kubernetes", "apiVersion": "scheduling.k8s.io/v1alpha2",
                                   "podGroup": "mnist", "minAvailable": 6}
    assert [e.reason for e in plan.events] == ["GangScheduling"]
    assert [o["kind"] for o in plan.create] == ["Service", "Workload", "PodGroup"] + ["Pod"] * 6
    again = reconcile(state(six_gpu_workers(), plan.status, served=frozenset()), [], NOW)
    assert again.status["gang"] == plan.status["gang"] and not again.events, "kept, not chosen again"


def test_no_gang_api_fails_the_job_naming_the_field() -> None:
    plan = reconcile(state(six_gpu_workers(), served=frozenset()), [], NOW)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "GangUnavailable")
    assert plan.status["message"].startswith("runPolicy.scheduling.gang.provider Auto: this cluster serves no")


def test_a_waiting_gang_says_so_in_the_schedulers_words() -> None:
    first = reconcile(state(six_gpu_workers()), [], NOW)
    pods = [pod("worker", i, unschedulable="0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
            for i in range(6)]
    plan = reconcile(state(six_gpu_workers(), first.status), pods, NOW)
    assert plan.status["reason"] == "WaitingForGang"
    assert plan.status["message"] == ("waiting for gang scheduling (Kubernetes): 0/6 pods scheduled, the gang needs 6 "
                                      "together; 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")


def test_the_group_goes_when_the_job_finishes_is_suspended_or_restarts() -> None:
    chosen = reconcile(state(six_gpu_workers()), [], NOW).status
    running = [pod("worker", i, "Running", scheduled=True) for i in range(6)]
    status = reconcile(state(six_gpu_workers(), chosen), running, NOW).status
    done = reconcile(state(six_gpu_workers(), status), [pod("worker", 0, "Succeeded", True), *running[1:]], NOW)
    assert done.status["phase"] == "Succeeded"
    assert [o["kind"] for o in done.delete_objects] == ["Workload", "PodGroup"]
    killed = dataclasses.replace(pod("worker", 0, "Failed", True), exit_code=137)
    restart = reconcile(state(six_gpu_workers(), status), [killed, *running[1:]], NOW)
    assert restart.status["phase"] == "Restarting" and [o["kind"] for o in restart.delete_objects] == [
        "Workload", "PodGroup"]
    suspended = reconcile(state(parse_spec(with_gang(tf_job("mnist", {"suspend": True}, worker=replica(6)))["spec"]),
                                status), running, NOW)
    assert suspended.status["phase"] == "Suspended" and suspended.delete_objects


def test_volcano_pods_wait_for_the_group_to_be_admitted() -> None:
    spec = parse_spec(with_gang(tf_job("mnist", None, worker=replica(2)), provider="Volcano")["spec"])
    chosen = reconcile(state(spec), [], NOW)
    assert [o["kind"] for o in chosen.create] == ["Service", "PodGroup"], "the group first, no pods"
    assert chosen.requeue_after is not None
    waiting = reconcile(state(spec, chosen.status, group=GroupStatus("Pending", "queue research is full")), [], NOW)
    assert not [o for o in waiting.create if o["kind"] == "Pod"]
    assert waiting.status["message"].endswith("Volcano has not admitted PodGroup mnist to its queue yet: "
                                              "queue research is full")
    admitted = reconcile(state(spec, chosen.status, group=GroupStatus("Inqueue", "")), [], NOW)
    assert len([o for o in admitted.create if o["kind"] == "Pod"]) == 2


def test_render_shows_the_group() -> None:
    spec = six_gpu_workers()
    kinds = [o["kind"] for o in supporting_objects(REF, spec, None, (), GangProvider.KUBERNETES)]
    assert kinds == ["Service", "Workload", "PodGroup"]


def test_a_kubernetes_gang_chosen_on_136_is_made_as_v1beta1_once_the_cluster_serves_only_that() -> None:
    """Issue 31: status.gang.apiVersion was read once and kept. After a 1.36 -> 1.37 upgrade a job
    restarted, resumed or taken over made its group as v1alpha2, which 1.37 no longer serves."""
    chosen = reconcile(state(six_gpu_workers()), [], NOW).status
    assert chosen["gang"]["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    upgraded = frozenset({"scheduling.k8s.io/v1beta1"})
    plan = reconcile(state(six_gpu_workers(), chosen, served=upgraded), [], NOW)
    assert {o["apiVersion"] for o in plan.create if o["kind"] in ("Workload", "PodGroup")} == {
        "scheduling.k8s.io/v1beta1"}
    assert plan.status["gang"]["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert [e.message for e in plan.events] == [
        "the cluster serves scheduling.k8s.io/v1beta1, not scheduling.k8s.io/v1alpha2: PodGroup mnist is made as "
        "scheduling.k8s.io/v1beta1"]
    running = [pod("worker", i, "Running", scheduled=True) for i in range(6)]
    done = reconcile(state(six_gpu_workers(), chosen, served=upgraded),
                     [pod("worker", 0, "Succeeded", True), *running[1:]], NOW)
    assert {o["apiVersion"] for o in done.delete_objects} == {"scheduling.k8s.io/v1beta1"}, "released as served"


def test_a_137_group_takes_its_pods_priority_from_their_templates_too() -> None:
    """Issue 31: the 1.37 PodGroup took runPolicy's priorityClassName only: pods whose templates
    name their own class (builders/scheduling.py keeps it) went with a group of another priority, which
    the scheduler refuses. Members that differ are refused when the provider is chosen."""
    job = with_gang(tf_job("mnist", None, worker=replica(2, gpus=1)))
    job["spec"]["tensorflow"]["worker"]["template"]["spec"]["priorityClassName"] = "high"
    spec = parse_spec(job["spec"])
    assert spec.run_policy.scheduling.gang is not None
    _, group = gang.objects(REF, spec, spec.run_policy.scheduling.gang, GangProvider.KUBERNETES,
                            "scheduling.k8s.io/v1beta1")
    assert group["spec"]["priorityClassName"] == "high"
    mixed = with_gang(tf_job("mnist", None, chief=replica(1), worker=replica(2)))
    mixed["spec"]["tensorflow"]["worker"]["template"]["spec"]["priorityClassName"] = "high"
    plan = reconcile(state(parse_spec(mixed["spec"])), [], NOW)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "InvalidSpec")
    assert plan.status["message"] == (
        "spec.tensorflow.*.template.spec.priorityClassName: the pods of a Kubernetes gang share one priority, its "
        "PodGroup's, and these differ (chief (none), worker high)")
