"""The DistTrainJob CustomResourceDefinition, generated.

`crd_spec` writes the schema of `spec`; this module adds the status, the rules on the whole
object, the printer columns, and writes the YAML. `crds/disttrainjobs.disttrain.dev.yaml` is
this module's output (`disttrain crd`, `make crd`); a test keeps them equal.
"""

from __future__ import annotations

import yaml

from disttrain.api.constants import (
    CATEGORY,
    CLAIMED_GPUS,
    GROUP,
    KIND,
    MAX_DNS_LABEL,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
    VERSION,
)
from disttrain.api.crd_checkpoint import checkpoint_status_schema, last_checkpoint_schema
from disttrain.api.crd_columns import printer_columns
from disttrain.api.crd_restarts import CLAIMED_GPUS_SCHEMA, DELETED_PODS, PREVIOUS_PODS
from disttrain.api.crd_run_policy import advanced_schema, gang_size_rule, run_policy_schema
from disttrain.api.crd_size import size_rules
from disttrain.api.crd_spec import (
    FlowMapping,
    Schema,
    enum_field,
    int_field,
    managed_by_rule,
    managed_by_schema,
    mpi_schema,
    string_field,
    tensorflow_schema,
)
from disttrain.api.crd_usage import usage_status_schema
from disttrain.api.status import CONDITION_TYPES, Phase


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(FlowMapping, lambda dumper, data: dumper.represent_mapping(
    "tag:yaml.org,2002:map", data, flow_style=True))


def _name_length_rules() -> list[Schema]:
    """Every pod's name is also its hostname, a DNS label: at most 63 characters. The rules use
    size() arithmetic only: string concatenation on metadata.name (no declared max length) is
    costed by CEL at the request size and refused."""
    rules = []
    for framework, rtype in [("tensorflow", t) for t in ("chief", "ps", "worker", "evaluator")] + [
        ("mpi", "worker")
    ]:
        path = f"self.spec.{framework}.{rtype}"
        suffix = len(f"-{rtype}-")
        count = f"{path}.replicas"
        if framework == "mpi":  # an elastic job's highest index comes with maxReplicas
            count = f"(has(self.spec.mpi.elastic) ? self.spec.mpi.elastic.maxReplicas : {count})"
        rules.append({
            "rule": f"!has(self.spec.{framework}) || !has({path}) || "
                    f"size(self.metadata.name) + {suffix} + size(string({count} - 1)) <= {MAX_DNS_LABEL}",
            "message": f"metadata.name is too long: the pod name <name>-{rtype}-<index> is also its hostname, "
                       f"which allows {MAX_DNS_LABEL} characters",
            "reason": "FieldValueInvalid",
        })
    rules.append({
        "rule": f"!has(self.spec.mpi) || size(self.metadata.name) <= {MAX_DNS_LABEL - len('-launcher')}",
        "message": f"metadata.name is too long: the pod name <name>-launcher is also its hostname, which allows "
                   f"{MAX_DNS_LABEL} characters",
        "reason": "FieldValueInvalid",
    })
    return rules


def status_schema() -> Schema:
    counts = {k: int_field(f"Pods of this type that are {k}.") for k in ("active", "ready", "succeeded", "failed")}
    return {
        "type": "object", "description": "Where the job stands, written by the operator.",
        "properties": {
            "phase": enum_field("Pending, Running, Restarting, Succeeded, Failed or Suspended.",
                                [p.value for p in Phase]),
            "reason": string_field("Machine-readable reason of the last phase change."),
            "message": string_field("Human-readable explanation of the last phase change."),
            "framework": enum_field("tensorflow or mpi.", ["tensorflow", "mpi"]),
            "ready": string_field("Pods Ready / pods wanted, such as 3/4."),
            "restarts": int_field("Restarts so far: pods or the whole job recreated by the operator, plus container "
                             "restarts by the kubelet."),
            "operatorRestarts": int_field("The part of restarts that does not come from the current pods' containers: "
                                     "operator restarts and the container restarts of pods it replaced."),
            "deletedPods": DELETED_PODS, "previousPods": PREVIOUS_PODS, CLAIMED_GPUS: CLAIMED_GPUS_SCHEMA,
            "replicaStatuses": {
                "type": "object",
                "description": "Pod counts per replica type.",
                "additionalProperties": {"type": "object", "properties": counts},
            },
            "conditions": {
                "type": "array",
                "description": "Queued, Created, Running, Restarting, Succeeded, Failed, Suspended, Stalled.",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": enum_field("Condition type.", list(CONDITION_TYPES)),
                        "status": enum_field("True, False or Unknown.", ["True", "False", "Unknown"]),
                        "reason": string_field("Machine-readable reason of the last transition."),
                        "message": string_field("Human-readable message of the last transition."),
                        "lastTransitionTime": string_field("When the status last changed.", format="date-time"),
                    },
                },
            },
            "gang": gang_status_schema(),
            "elastic": elastic_status_schema(),
            "progress": progress_status_schema(), "usage": usage_status_schema(),
            "checkpoint": checkpoint_status_schema(), "lastCheckpoint": last_checkpoint_schema(),
            "sshSecret": string_field("An MPI job's SSH Secret (<job>-ssh-<its uid's first 8 characters>; <job>-ssh "
                                      "for a job started before that name)."),
            "startTime": string_field("When the operator started the job (or resumed it).", format="date-time"),
            "completionTime": string_field("When the job succeeded or failed.", format="date-time"),
            "observedGeneration": {"type": "integer", "format": "int64",
                                   "description": "The spec generation this status describes."},
        },
    }


def progress_status_schema() -> Schema:
    def count(what: str) -> Schema:
        return {"type": "integer", "format": "int64", "minimum": 0, "description": what}
    metric_map: Schema = {"type": "object", "description": "Metrics by name, as reported (at most 16).",
                          "additionalProperties": {"type": "number"}}
    reported = {"epoch": count("Epochs done."), "step": count("Steps done, over the whole training."),
                "metrics": metric_map, "reporter": string_field("The pod that reported."),
                "reportedAt": string_field("When it reported (the operator's clock).", format="date-time")}
    return {
        "type": "object",
        "description": "What the job's pods reported of their training (docs/api.md, Progress): the chief's (or "
                       "worker 0's, or MPI rank 0's) latest report, the evaluator's, and a short history.",
        "properties": {
            **reported,
            "totalEpochs": count("Epochs in all."),
            "totalSteps": count("Steps in all."),
            "percent": int_field("Percent done: steps done / total steps, else epochs done / total epochs.",
                                 minimum=0, maximum=100),
            "remainingSeconds": count("Seconds left at the recent rate."),
            "eta": string_field("Time left at the recent rate (7m12s), or stale."),
            "advanced": advanced_schema(),
            "stale": {"type": "boolean", "description": "True while a Running job's reporter has been silent too "
                                                        "long (5 minutes, or three of its usual intervals)."},
            "evaluation": {"type": "object", "description": "The evaluator's latest report.", "properties": reported},
            "history": {"type": "array", "maxItems": 64,
                        "description": "A point per status write with a newer report, oldest first; thinned as "
                                       "it grows so that it spans the whole training.",
                        "items": {"type": "object", "properties": {
                            "at": string_field("When it was reported.", format="date-time"),
                            "epoch": count("Epochs done."), "step": count("Steps done."), "metrics": metric_map}}},
        },
    }


def elastic_status_schema() -> Schema:
    return {
        "type": "object",
        "description": "An elastic MPI job's workers (spec.mpi.elastic).",
        "properties": {
            "wantedWorkers": int_field("spec.mpi.worker.replicas as the operator last read it."),
            "workers": int_field("Workers in discover_hosts.sh now: Ready, and within the wanted count (the scale "
                                 "subresource's status.replicas)."),
            "hosts": {"type": "array", "items": {"type": "string"},
                      "description": "The workers' pod names in discover_hosts.sh now."},
            "selector": string_field("The label selector of the job's workers (the scale subresource's, for an "
                                     "autoscaler)."),
            "scaleDownSince": string_field("When the first of the workers above the wanted count left discovery "
                                           "(status.elastic.leaving has each).", format="date-time"),
            "leaving": {"type": "object", "additionalProperties": {"type": "string", "format": "date-time"},
                        "description": "Each worker above the wanted count (pod name) and when it left discovery: it "
                                       "is deleted scaleDownDelaySeconds later."},
            "belowMinSince": string_field("Since when fewer than minReplicas workers are Ready while the job "
                                          "runs.", format="date-time"),
        },
    }


def gang_status_schema() -> Schema:
    return {
        "type": "object",
        "description": "The gang this job is scheduled as (runPolicy.scheduling.gang), once a provider is chosen; "
                       "it stays for the job's life.",
        "properties": {
            "provider": string_field("Kubernetes, SchedulerPlugins or Volcano."),
            "apiVersion": string_field("The provider's API version the cluster served when it was chosen (Kubernetes: "
                                       "scheduling.k8s.io/v1beta1 from 1.37, v1alpha2 in 1.36)."),
            "podGroup": string_field("Name of the PodGroup (and, for Kubernetes, the Workload)."),
            "minAvailable": int_field("Pods scheduled together."),
        },
    }


def job_schema() -> Schema:
    return {
        "type": "object",
        "description": "A distributed training job: TensorFlow (TF_CONFIG) or MPI (Horovod).",
        "required": ["spec"],
        "properties": {
            "apiVersion": string_field("APIVersion of this object: disttrain.dev/v1."),
            "kind": string_field("Kind of this object: DistTrainJob."),
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "description": "What to run. Exactly one of tensorflow or mpi.",
                "properties": {
                    "tensorflow": tensorflow_schema(),
                    "mpi": mpi_schema(),
                    "runPolicy": run_policy_schema(),
                    "managedBy": managed_by_schema(),
                },
                "x-kubernetes-validations": [
                    {"rule": "has(self.tensorflow) != has(self.mpi)",
                     "message": "exactly one of spec.tensorflow or spec.mpi must be set"},
                    {"rule": "has(self.tensorflow) == has(oldSelf.tensorflow)",
                     "message": "a job can't switch between spec.tensorflow and spec.mpi after it is created"},
                    gang_size_rule(),
                    managed_by_rule(),
                ],
            },
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            {"rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
             "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
                        "with a letter): it names the job's headless Service",
             "reason": "FieldValueInvalid"},
            *_name_length_rules(),
            *size_rules(),
        ],
    }


def crd() -> Schema:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": [SHORT_NAME], "categories": [CATEGORY]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": job_schema()},
                # `kubectl scale dtj/NAME --replicas=N` (and an autoscaler) changes an elastic MPI job's workers;
                # a TensorFlow job has no spec.mpi, and its scale answers that the field does not exist.
                "subresources": {"status": {}, "scale": {
                    "specReplicasPath": ".spec.mpi.worker.replicas",
                    "statusReplicasPath": ".status.elastic.workers",
                    "labelSelectorPath": ".status.elastic.selector"}},
                "additionalPrinterColumns": printer_columns(),
            }],
        },
    }


HEADER = ("# Generated by `disttrain crd` (operator/disttrain/api/crd.py) from the API server's PodTemplateSpec\n"
          "# schema; do not edit. Regenerate with `make crd`. Install with `kubectl apply --server-side`.\n")


def crd_yaml() -> str:
    return HEADER + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=110)
