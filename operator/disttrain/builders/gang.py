"""Gang scheduling: the pods created together are scheduled all at once or not at all, so two jobs
can't each hold part of the GPUs and wait for the rest forever.

Three providers, each an API a scheduler acts on (docs/api.md, "Gang scheduling"):
- Kubernetes: scheduling.k8s.io Workload and PodGroup (KEP-4671; kube-scheduler's gang plugin):
  v1alpha2 in 1.36 (the GangScheduling gate), v1beta1 in 1.37 (v1alpha2 removed; GenericWorkload,
  beta but off by default, turns it on); pods point at the group with spec.schedulingGroup, the
  same in both. The version the cluster serves is chosen with the provider, kept in the status;
- SchedulerPlugins: scheduling.x-k8s.io/v1alpha1 PodGroup (scheduler-plugins' Coscheduling); pods
  carry the label scheduling.x-k8s.io/pod-group and that scheduler's name;
- Volcano: scheduling.volcano.sh/v1beta1 PodGroup; pods carry the annotation
  scheduling.k8s.io/group-name and schedulerName volcano.

The group is the pods created together: every pod of a TensorFlow job; an MPI job's workers, plus
the launcher only with launcherStart: Immediately (policies/startup.py says why a launcher created
later must not count: it would never fit a group sized for it). It joins the group when it comes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from disttrain.api import defaults
from disttrain.api.constants import GROUP, KIND
from disttrain.api.objects import JobRef, PodKey, object_meta
from disttrain.api.observed import ObservedPod
from disttrain.api.spec import Gang, GangProvider, JobSpec, LauncherStart, ReplicaType
from disttrain.builders.naming import job_labels
from disttrain.builders.pods import desired_pod_keys
from disttrain.builders.resources import pod_requests

SP_POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
# Kubernetes' own, newest first. 1.37's PodGroup names its Workload in spec.workloadRef (1.36's in
# spec.podGroupTemplateRef.workload), and its scheduler refuses a group whose pods' priority isn't
# the PodGroup's own (k8s.io/api v0.37.2 scheduling/v1beta1; scheduler schedule_one_podgroup.go).
KUBERNETES_APIS = ("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha2")
V1ALPHA2 = KUBERNETES_APIS[1]
# What each provider's objects are: apiVersion (the newest), kind (the Workload only for Kubernetes).
API = {
    GangProvider.KUBERNETES: KUBERNETES_APIS[0],
    GangProvider.SCHEDULER_PLUGINS: "scheduling.x-k8s.io/v1alpha1",
    GangProvider.VOLCANO: "scheduling.volcano.sh/v1beta1",
}
TEMPLATE = "gang"  # the Workload's one pod group template


@dataclass(frozen=True)
class GroupStatus:
    """What the operator read of a group that gates pod creation (Volcano: its phase)."""

    phase: str
    message: str


def group_name(job: str) -> str:
    return job


def members(spec: JobSpec) -> list[PodKey]:
    """The pods created together: the gang."""
    return [k for k in desired_pod_keys(spec) if not (
        k.replica_type == ReplicaType.LAUNCHER and spec.mpi is not None
        and spec.mpi.launcher_start is LauncherStart.WHEN_WORKERS_READY)]


def min_available(spec: JobSpec, gang: Gang) -> int:
    """An elastic job's gang is its fewest workers (and the launcher, if made with them): the rest
    may come later, one at a time, as a scale-up or a replacement does."""
    if gang.min_available:
        return gang.min_available
    if spec.mpi is not None and spec.mpi.elastic is not None:
        return spec.mpi.elastic.min_replicas + sum(1 for k in members(spec) if k.replica_type == ReplicaType.LAUNCHER)
    return len(members(spec))


def min_resources(spec: JobSpec, gang: Gang) -> dict[str, str]:
    """What the first `min_available` members ask for together (scheduler-plugins and Volcano
    admit a group only when that much is free)."""
    total: dict[str, Decimal] = {}
    counts = Counter(key.replica_type for key in members(spec)[:min_available(spec, gang)])
    for rtype, count in counts.items():  # a template's requests read once, not once a pod
        for name, amount in pod_requests(spec.replicas[rtype].template).items():
            total[name] = total.get(name, Decimal(0)) + amount * count
    return {name: _quantity(amount) for name, amount in sorted(total.items())}


def _quantity(amount: Decimal) -> str:
    return str(amount.normalize()) if amount == amount.to_integral_value() else f"{int(amount * 1000)}m"


def choose(gang: Gang, served: Collection[GangProvider], scheduler_name: str | None) -> GangProvider | None:
    """The provider for a job: the one it names, if served; with Auto, the one its schedulerName
    points at (volcano, or another scheduler: scheduler-plugins), else Kubernetes' own, else
    whichever is served. None: the cluster serves none that fits."""
    if gang.provider is not GangProvider.AUTO:
        return gang.provider if gang.provider in served else None
    if scheduler_name == defaults.VOLCANO_SCHEDULER and GangProvider.VOLCANO in served:
        return GangProvider.VOLCANO
    if scheduler_name not in (None, "default-scheduler") and GangProvider.SCHEDULER_PLUGINS in served:
        return GangProvider.SCHEDULER_PLUGINS
    return next((p for p in (GangProvider.KUBERNETES, GangProvider.SCHEDULER_PLUGINS, GangProvider.VOLCANO)
                 if p in served), None)


def scheduler_conflict(spec: JobSpec, provider: GangProvider) -> str | None:
    """Every pod of a group must go to the same scheduler, and (Kubernetes' own gang) with one
    priority: a template naming another one is an error."""
    wanted = pod_scheduler(spec, provider)
    for rtype, replica in spec.replicas.items():
        named = (replica.template.get("spec") or {}).get("schedulerName")
        if named and named != wanted:
            return (f"spec.{spec.framework.value}.{rtype}.template.spec.schedulerName is {named!r}, but every pod of "
                    f"a gang goes to one scheduler ({wanted!r}, runPolicy.scheduling)")
    classes = member_priority_classes(spec)
    if provider is GangProvider.KUBERNETES and len(set(classes.values())) > 1:
        said = ", ".join(f"{rtype} {name or '(none)'}" for rtype, name in classes.items())
        return (f"spec.{spec.framework.value}.*.template.spec.priorityClassName: the pods of a Kubernetes gang share "
                f"one priority, its PodGroup's, and these differ ({said})")
    return None


def member_priority_classes(spec: JobSpec) -> dict[str, str]:
    """The priorityClassName each gang member's replica type gets (builders/scheduling.py: its
    template's own, else runPolicy's; "" for none, the cluster's globalDefault)."""
    default = spec.run_policy.scheduling.priority_class_name or ""
    return {str(rtype): str((spec.replicas[rtype].template.get("spec") or {}).get("priorityClassName") or default)
            for rtype in dict.fromkeys(k.replica_type for k in members(spec))}


def group_priority_class(spec: JobSpec) -> str | None:
    """The PodGroup's priorityClassName: its members' (one, scheduler_conflict says), however they
    got it. None when they name none."""
    return next(iter(member_priority_classes(spec).values()), "") or None


def pod_scheduler(spec: JobSpec, provider: GangProvider) -> str:
    named = spec.run_policy.scheduling.scheduler_name
    if named:
        return named
    return {GangProvider.SCHEDULER_PLUGINS: defaults.SCHEDULER_PLUGINS_SCHEDULER,
            GangProvider.VOLCANO: defaults.VOLCANO_SCHEDULER}.get(provider, "default-scheduler")


def apis(provider: GangProvider) -> tuple[str, ...]:
    return KUBERNETES_APIS if provider is GangProvider.KUBERNETES else (API[provider],)


def providers(served: Collection[str]) -> frozenset[GangProvider]:
    """The providers whose API (any version of it) is among the `served` group/versions."""
    return frozenset(p for p in API if any(api in served for api in apis(p)))


def api_version(provider: GangProvider, served: Collection[str]) -> str:
    """The newest version of the provider's API the cluster serves."""
    return next((api for api in apis(provider) if api in served), API[provider])


def objects(job: JobRef, spec: JobSpec, gang: Gang, provider: GangProvider,
            api: str | None = None) -> list[dict[str, Any]]:
    """The group, made before any pod (for Kubernetes the Workload first: 1.36 refuses a PodGroup
    naming a Workload that doesn't exist). `api`: the version chosen (status.gang.apiVersion)."""
    name, count = group_name(job.name), min_available(spec, gang)
    meta = object_meta(job, name, job_labels(job.name))
    api = api or API[provider]
    if provider is GangProvider.KUBERNETES:
        return kubernetes_objects(job, spec, meta, count, api)
    group_spec: dict[str, Any] = {"minMember": count, "minResources": min_resources(spec, gang)}
    if provider is GangProvider.SCHEDULER_PLUGINS and gang.timeout_seconds:
        group_spec["scheduleTimeoutSeconds"] = gang.timeout_seconds
    if provider is GangProvider.VOLCANO:
        scheduling = spec.run_policy.scheduling
        if scheduling.queue:
            group_spec["queue"] = scheduling.queue
        if scheduling.priority_class_name:
            group_spec["priorityClassName"] = scheduling.priority_class_name
    return [{"apiVersion": api, "kind": "PodGroup", "metadata": meta, "spec": group_spec}]


def kubernetes_objects(job: JobRef, spec: JobSpec, meta: dict[str, Any], count: int, api: str) -> list[dict[str, Any]]:
    """Kubernetes' Workload with one gang template, and the PodGroup made from it."""
    name = meta["name"]
    workload = {"apiVersion": api, "kind": "Workload", "metadata": meta, "spec": {
        "controllerRef": {"apiGroup": GROUP, "kind": KIND, "name": job.name},
        "podGroupTemplates": [{"name": TEMPLATE, "schedulingPolicy": {"gang": {"minCount": count}}}]}}
    group_spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": count}}}
    if api == V1ALPHA2:
        group_spec["podGroupTemplateRef"] = {"workload": {"workloadName": name, "podGroupTemplateName": TEMPLATE}}
    else:
        group_spec["workloadRef"] = {"workloadName": name, "templateName": TEMPLATE}
        if (priority := group_priority_class(spec)) is not None:  # the pods' priority, or the scheduler refuses them
            group_spec["priorityClassName"] = priority
    return [workload, {"apiVersion": api, "kind": "PodGroup", "metadata": dict(meta), "spec": group_spec}]


def pod_fields(job: JobRef, spec: JobSpec, provider: GangProvider, pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod joined to the group, sent to the group's scheduler."""
    out = dict(pod)
    meta, pod_spec = dict(out["metadata"]), dict(out["spec"])
    name = group_name(job.name)
    if provider is GangProvider.KUBERNETES:
        pod_spec["schedulingGroup"] = {"podGroupName": name}
    elif provider is GangProvider.SCHEDULER_PLUGINS:
        meta["labels"] = dict(meta.get("labels") or {}) | {SP_POD_GROUP_LABEL: name}
    else:
        meta["annotations"] = dict(meta.get("annotations") or {}) | {VOLCANO_GROUP_ANNOTATION: name}
    pod_spec["schedulerName"] = pod_scheduler(spec, provider)
    out["metadata"], out["spec"] = meta, pod_spec
    return out


def admitted(provider: GangProvider, group: GroupStatus | None) -> bool:
    """Whether pods may be made: at once, but for Volcano once it has taken the group into its
    queue (as Volcano's own Job controller does: pods of a group not yet Inqueue only wait)."""
    if provider is not GangProvider.VOLCANO:
        return True
    return group is not None and group.phase in ("Inqueue", "Running", "Completed")


def waiting(job: str, spec: JobSpec, gang: Gang, provider: GangProvider, pods: Sequence[ObservedPod],
            group: GroupStatus | None) -> str | None:
    """Why the gang isn't running yet, in the scheduler's own words where it has any; None once
    every member is scheduled."""
    # The members once, as a set: built again for each pod (and searched as a list), they made this
    # O(pods²), half of the operator's CPU with a 1,024-worker job waiting for its gang (issue 45).
    wanted = set(members(spec))
    gang_pods = [p for p in pods if not p.terminating and PodKey(p.replica_type, p.index) in wanted]
    scheduled = sum(1 for p in gang_pods if p.scheduled)
    need = min_available(spec, gang)
    if gang_pods and scheduled >= len(wanted):
        return None
    said = next((p.unschedulable for p in gang_pods if p.unschedulable), None)
    if provider is GangProvider.VOLCANO and not admitted(provider, group):
        said = f"Volcano has not admitted PodGroup {group_name(job)} to its queue yet" + (
            f": {group.message}" if group and group.message else f" (phase {group.phase if group else 'unknown'})")
    return (f"waiting for gang scheduling ({provider.value}): {scheduled}/{len(wanted)} pods scheduled, "
            f"the gang needs {need} together" + (f"; {said}" if said else ""))

