"""Kueue's topology-aware scheduling (TAS), asked for per replica type with the annotations Kueue
reads on any job's pod template (Kueue v0.19.2, apis/kueue/v1beta2/topology_types.go), and the
rules Kueue's own integrations check on them (jobframework/tas_validation.go) as CEL, so a bad
request fails at `kubectl apply`, not in a queue forever."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREFIX = "kueue.x-k8s.io/"
REQUIRED = PREFIX + "podset-required-topology"  # every pod of the replica type in one domain of that level
PREFERRED = PREFIX + "podset-preferred-topology"  # in as few domains of that level as fit
UNCONSTRAINED = PREFIX + "podset-unconstrained-topology"  # "true": anywhere, placed by Kueue
SLICE_REQUIRED = PREFIX + "podset-slice-required-topology"  # slices of SLICE_SIZE pods, each in one domain
SLICE_SIZE = PREFIX + "podset-slice-size"
GROUP = PREFIX + "podset-group-name"  # two replica types placed together (one of them a single pod)
# What a pod of an admitted TAS podSet carries for Kueue's TopologyUngater (pkg/controller/tas):
# the gate it lifts once it has written the assigned domain into the pod's nodeSelector, the
# Workload's name (an annotation) and the podSet's (a label) by which it finds the pods.
SCHEDULING_GATE = PREFIX + "topology"
WORKLOAD_ANNOTATION = PREFIX + "workload"
PODSET_LABEL = PREFIX + "podset"
ASKS = (REQUIRED, PREFERRED, UNCONSTRAINED, SLICE_REQUIRED)  # any of them: the pod is Kueue's to place (tas.go)


def topology_request(annotations: Mapping[str, str], index_label: str) -> dict[str, Any] | None:
    """A podSet's `topologyRequest`, as Kueue's integrations build it from the template (jobframework
    tas.go): one of required, preferred or unconstrained, the slices, the group; the pods' index
    label, by which Kueue's ungater gives pod i the i-th place of the assignment."""
    request: dict[str, Any] = {}
    if annotations.get(REQUIRED):
        request["required"] = annotations[REQUIRED]
    elif annotations.get(PREFERRED):
        request["preferred"] = annotations[PREFERRED]
    elif annotations.get(UNCONSTRAINED):
        request["unconstrained"] = annotations[UNCONSTRAINED] == "true"
    if annotations.get(SLICE_REQUIRED):
        request["podSetSliceRequiredTopology"] = annotations[SLICE_REQUIRED]
        request["podSetSliceSize"] = int(annotations.get(SLICE_SIZE) or 1)
    if not request:
        return None
    if annotations.get(GROUP) and ("required" in request or "preferred" in request):
        request["podSetGroupName"] = annotations[GROUP]
    request["podIndexLabel"] = index_label
    return request


def template_rules() -> list[dict[str, str]]:
    """CEL rules on a replica's `template.metadata`, as Kueue checks its own jobs' templates."""
    has = "has(self.annotations) && '{}' in self.annotations"
    one_of = " + ".join(f"({has.format(k)} ? 1 : 0)" for k in (REQUIRED, PREFERRED, UNCONSTRAINED))
    size = f"self.annotations['{SLICE_SIZE}']"
    return [
        {"rule": f"{one_of} <= 1",
         "message": f"at most one of the annotations {REQUIRED}, {PREFERRED} and {UNCONSTRAINED}"},
        {"rule": f"!({has.format(UNCONSTRAINED)}) || self.annotations['{UNCONSTRAINED}'] in ['true', 'false']",
         "message": f"annotation {UNCONSTRAINED} is \"true\" or \"false\""},
        {"rule": f"({has.format(SLICE_REQUIRED)}) == ({has.format(SLICE_SIZE)})",
         "message": f"annotations {SLICE_REQUIRED} and {SLICE_SIZE} go together"},
        {"rule": f"!({has.format(SLICE_SIZE)}) || ({size}.size() <= 6 && {size}.matches('^[1-9][0-9]*$'))",
         "message": f"annotation {SLICE_SIZE} is a whole number of pods, at least 1"},
        {"rule": f"!({has.format(GROUP)}) || ({has.format(REQUIRED)}) || ({has.format(PREFERRED)})",
         "message": f"annotation {GROUP} goes with {REQUIRED} or {PREFERRED}"},
    ]
