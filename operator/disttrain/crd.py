"""The DistTrainJob CustomResourceDefinition, generated.

Our own fields are written here with their descriptions, defaults (from `defaults`) and CEL
rules; the pod templates use the real PodTemplateSpec schema that `hack/gen_podtemplate_schema.py`
extracts from the API server's OpenAPI (descriptions dropped to keep the CRD small; see
api.md). `crds/disttrainjobs.disttrain.dev.yaml` is this module's output; a test keeps them equal.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from typing import Any

import yaml

from disttrain import defaults
from disttrain.constants import CATEGORY, GROUP, KIND, MAX_DNS_LABEL, PLURAL, SHORT_NAME, SINGULAR, VERSION
from disttrain.spec import (
    CleanPodPolicy,
    LauncherStart,
    MPIImplementation,
    RestartPolicy,
    RestartScope,
    SuccessPolicy,
)
from disttrain.status import CONDITION_TYPES, Phase

Schema = dict[str, Any]


class _Flow(dict[str, Any]):
    """A generated pod-template schema: written in flow style, so the six copies stay compact
    (block style indents them into ~1 MB of YAML) while our own fields stay readable."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Flow, lambda dumper, data: dumper.represent_mapping(
    "tag:yaml.org,2002:map", data, flow_style=True))


@functools.cache
def pod_template_schema() -> Schema:
    text = resources.files("disttrain").joinpath("schema/podtemplatespec.json").read_text()
    schema: Schema = json.loads(text)
    return schema


def _str(description: str, **extra: Any) -> Schema:
    return {"type": "string", "description": description, **extra}


def _int(description: str, **extra: Any) -> Schema:
    return {"type": "integer", "format": "int32", "description": description, **extra}


def _enum(description: str, values: list[str], default: str | None = None) -> Schema:
    out: Schema = {"type": "string", "enum": values, "description": description}
    if default is not None:
        out["default"] = default
    return out


def _immutable(schema: Schema, what: str) -> Schema:
    out = dict(schema)
    out["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": f"{what} can't be changed after the job is created"}
    ]
    return out


def replica_spec(role: str, description: str, *, minimum: int = 0, maximum: int | None = None) -> Schema:
    replicas = _int(f"Number of {role} pods.", minimum=minimum, default=defaults.REPLICAS)
    if maximum is not None:
        replicas["maximum"] = maximum
    template = _Flow(copy.deepcopy(pod_template_schema()))
    template["description"] = (
        f"Pod template for the {role} pods, a Kubernetes PodTemplateSpec. The operator adds the name, "
        "hostname, subdomain, labels, owner reference and environment (TF_CONFIG, DISTTRAIN_*); "
        "everything else goes to the pod as written."
    )
    return {
        "type": "object",
        "description": description,
        "required": ["template"],
        "properties": {
            "replicas": _immutable(replicas, f"the number of {role} replicas"),
            "restartPolicy": _enum(
                "What happens when a pod fails. Never: the job fails. OnFailure / Always: the kubelet "
                "restarts the container (counted toward runPolicy.backoffLimit). ExitCode: exit codes 128 "
                "and above (signals, OOM-kill, eviction) are retried, 1-127 fail the job.",
                [p.value for p in RestartPolicy], defaults.REPLICA_RESTART_POLICY,
            ),
            "template": template,
        },
    }


def tensorflow_schema() -> Schema:
    return {
        "type": "object",
        "description": "A TensorFlow job: every pod gets TF_CONFIG describing the cluster "
        "(MultiWorkerMirroredStrategy, ParameterServerStrategy, TF1 between-graph ps/worker).",
        "properties": {
            "chief": replica_spec("chief", "The chief (at most one): coordinates training and writes "
                                  "checkpoints; its success ends the job.", maximum=1),
            "ps": replica_spec("parameter server", "Parameter servers (ParameterServerStrategy). They never "
                               "exit on their own; the operator deletes them when the job finishes."),
            "worker": replica_spec("worker", "Workers. Without a chief, worker 0 decides success "
                                   "(or every worker, with successPolicy AllWorkers)."),
            "evaluator": replica_spec("evaluator", "The evaluator (at most one): evaluates checkpoints "
                                      "beside training; it never decides success.", maximum=1),
            "port": _immutable(_int("The port every TensorFlow task listens on.", minimum=1, maximum=65535,
                                    default=defaults.TF_PORT), "spec.tensorflow.port"),
            "successPolicy": _immutable(_enum(
                "Without a chief: ChiefOrWorker0 ends the job when worker 0 succeeds, AllWorkers when "
                "every worker has.", [p.value for p in SuccessPolicy], defaults.TF_SUCCESS_POLICY),
                "spec.tensorflow.successPolicy"),
        },
        "x-kubernetes-validations": [{
            "rule": "(has(self.chief) && self.chief.replicas > 0) || (has(self.worker) && self.worker.replicas > 0)",
            "message": "spec.tensorflow needs at least one chief or worker replica",
        }],
    }


def mpi_schema() -> Schema:
    return {
        "type": "object",
        "description": "An MPI job (Horovod or any mpirun program): worker pods running sshd and one launcher "
        "pod that runs mpirun over them with a generated hostfile and SSH key.",
        "required": ["launcher", "worker"],
        "properties": {
            "implementation": _immutable(_enum(
                "The MPI implementation the image uses; decides the hostfile format and launcher environment.",
                [m.value for m in MPIImplementation], defaults.MPI_IMPLEMENTATION), "spec.mpi.implementation"),
            "slotsPerWorker": _immutable(_int(
                "MPI slots (processes) per worker. Default: the worker container's nvidia.com/gpu limit, else 1.",
                minimum=1), "spec.mpi.slotsPerWorker"),
            "launcher": replica_spec("launcher", "The launcher: exactly one pod, which runs mpirun. It asks "
                                     "for no GPU unless its template does.", minimum=1, maximum=1),
            "worker": replica_spec("worker", "The workers mpirun starts ranks on (at least one).", minimum=1),
            "sshAuthMountPath": _str("Where the generated SSH key, authorized_keys and ssh config are mounted.",
                                     default=defaults.MPI_SSH_AUTH_MOUNT_PATH),
            "launcherStart": _enum(
                "WhenWorkersReady: create the launcher once every worker is Ready. Immediately: create it with "
                "the workers; mpirun's ssh retries refused connections (ConnectionAttempts=10) but not a worker "
                "name that does not resolve yet, so the launcher command must wait for its hosts itself.",
                [s.value for s in LauncherStart], defaults.MPI_LAUNCHER_START),
        },
    }


def run_policy_schema() -> Schema:
    return {
        "type": "object",
        "description": "How the job is run: restarts, deadlines, cleanup, suspension and scheduling.",
        "default": {},
        "properties": {
            "backoffLimit": _int("Restarts (pod- or job-level, and kubelet container restarts) allowed before "
                                 "the job fails.", minimum=0, default=defaults.BACKOFF_LIMIT),
            "restartScope": _enum(
                "Pod: recreate only the failed pod. Job: delete and recreate every pod of the job. Default: Job "
                "for synchronous training (tensorflow without ps, and mpi), Pod for tensorflow with ps.",
                [s.value for s in RestartScope]),
            "activeDeadlineSeconds": {"type": "integer", "format": "int64", "minimum": 1, "description":
                                      "Seconds the job may run (from its start or resume) before it fails with "
                                      "reason DeadlineExceeded."},
            "ttlSecondsAfterFinished": {"type": "integer", "format": "int64", "minimum": 0, "description":
                                        "Seconds after the job finishes when the DistTrainJob itself (and "
                                        "everything it owns) is deleted."},
            "cleanPodPolicy": _enum(
                "Which pods to delete when the job finishes: Running (those still running, such as parameter "
                "servers and evaluators), All, or None.", [c.value for c in CleanPodPolicy],
                defaults.CLEAN_POD_POLICY),
            "suspend": {"type": "boolean", "default": defaults.SUSPEND, "description":
                        "true: delete the job's pods and hold it in phase Suspended; false again: start afresh."},
            "scheduling": {
                "type": "object",
                "description": "Scheduling of the job's pods.",
                "properties": {
                    "schedulerName": _str("Scheduler for every pod (for example volcano), unless a template "
                                          "names its own."),
                    "gang": {"type": "boolean", "default": defaults.GANG, "description":
                             "Gang-schedule: a PodGroup with minMember = all pods (Volcano or scheduler-plugins). "
                             "Accepted but not acted on yet in this version."},
                    "queue": _str("Queue of the PodGroup (Volcano). Not acted on yet in this version."),
                    "priorityClassName": _str("PriorityClass for every pod, unless a template names its own."),
                },
            },
        },
    }


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
        rules.append({
            "rule": f"!has(self.spec.{framework}) || !has({path}) || "
                    f"size(self.metadata.name) + {suffix} + size(string({path}.replicas - 1)) <= {MAX_DNS_LABEL}",
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
    counts = {k: _int(f"Pods of this type that are {k}.") for k in ("active", "ready", "succeeded", "failed")}
    return {
        "type": "object",
        "description": "Where the job stands, written by the operator.",
        "properties": {
            "phase": _enum("Pending, Running, Restarting, Succeeded, Failed or Suspended.", [p.value for p in Phase]),
            "reason": _str("Machine-readable reason of the last phase change."),
            "message": _str("Human-readable explanation of the last phase change."),
            "framework": _enum("tensorflow or mpi.", ["tensorflow", "mpi"]),
            "ready": _str("Pods Ready / pods wanted, such as 3/4."),
            "restarts": _int("Restarts so far: pods or the whole job recreated by the operator, plus container "
                             "restarts by the kubelet."),
            "operatorRestarts": _int("The part of restarts that does not come from the current pods' containers: "
                                     "operator restarts and the container restarts of pods it replaced."),
            "replicaStatuses": {
                "type": "object",
                "description": "Pod counts per replica type.",
                "additionalProperties": {"type": "object", "properties": counts},
            },
            "conditions": {
                "type": "array",
                "description": "Created, Running, Restarting, Succeeded, Failed, Suspended.",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": _enum("Condition type.", list(CONDITION_TYPES)),
                        "status": _enum("True, False or Unknown.", ["True", "False", "Unknown"]),
                        "reason": _str("Machine-readable reason of the last transition."),
                        "message": _str("Human-readable message of the last transition."),
                        "lastTransitionTime": _str("When the status last changed.", format="date-time"),
                    },
                },
            },
            "startTime": _str("When the operator started the job (or resumed it).", format="date-time"),
            "completionTime": _str("When the job succeeded or failed.", format="date-time"),
            "observedGeneration": {"type": "integer", "format": "int64",
                                   "description": "The spec generation this status describes."},
        },
    }


def job_schema() -> Schema:
    return {
        "type": "object",
        "description": "A distributed training job: TensorFlow (TF_CONFIG) or MPI (Horovod).",
        "required": ["spec"],
        "properties": {
            "apiVersion": _str("APIVersion of this object: disttrain.dev/v1."),
            "kind": _str("Kind of this object: DistTrainJob."),
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "description": "What to run. Exactly one of tensorflow or mpi.",
                "properties": {
                    "tensorflow": tensorflow_schema(),
                    "mpi": mpi_schema(),
                    "runPolicy": run_policy_schema(),
                },
                "x-kubernetes-validations": [
                    {"rule": "has(self.tensorflow) != has(self.mpi)",
                     "message": "exactly one of spec.tensorflow or spec.mpi must be set"},
                    {"rule": "has(self.tensorflow) == has(oldSelf.tensorflow)",
                     "message": "a job can't switch between spec.tensorflow and spec.mpi after it is created"},
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
        ],
    }


def printer_columns() -> list[Schema]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Phase of the job."},
        {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "Pods Ready / wanted."},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Restarts so far."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Framework", "type": "string", "jsonPath": ".status.framework", "priority": 1},
        {"name": "Started", "type": "date", "jsonPath": ".status.startTime", "priority": 1},
        {"name": "Completed", "type": "date", "jsonPath": ".status.completionTime", "priority": 1},
    ]


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
                "subresources": {"status": {}},
                "additionalPrinterColumns": printer_columns(),
            }],
        },
    }


HEADER = ("# Generated by `disttrain crd` (operator/disttrain/crd.py) from the API server's PodTemplateSpec\n"
          "# schema; do not edit. Regenerate with `make crd`. Install with `kubectl apply --server-side`.\n")


def crd_yaml() -> str:
    return HEADER + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=110)
