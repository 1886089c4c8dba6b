"""The schema of a DistTrainJob's `spec`: our own fields with their descriptions, defaults (from
`defaults`) and CEL rules, and the pod templates as the real PodTemplateSpec schema that
`hack/gen_podtemplate_schema.py` extracts from the API server's OpenAPI (descriptions dropped to
keep the CRD small: it appears once per replica type)."""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from typing import Any

from disttrain.api import defaults
from disttrain.api.spec import (
    CleanPodPolicy,
    Egress,
    GangProvider,
    LauncherStart,
    MPIImplementation,
    RestartPolicy,
    RestartScope,
    SuccessPolicy,
)

Schema = dict[str, Any]


class FlowMapping(dict[str, Any]):
    """A generated pod-template schema: written in flow style, so the six copies stay compact
    (block style indents them into ~1 MB of YAML) while our own fields stay readable."""


@functools.cache
def pod_template_schema() -> Schema:
    text = resources.files("disttrain.api").joinpath("schema/podtemplatespec.json").read_text()
    schema: Schema = json.loads(text)
    return schema


def string_field(description: str, **extra: Any) -> Schema:
    return {"type": "string", "description": description, **extra}


def int_field(description: str, **extra: Any) -> Schema:
    return {"type": "integer", "format": "int32", "description": description, **extra}


def enum_field(description: str, values: list[str], default: str | None = None) -> Schema:
    out: Schema = {"type": "string", "enum": values, "description": description}
    if default is not None:
        out["default"] = default
    return out


def immutable(schema: Schema, what: str) -> Schema:
    out = dict(schema)
    out["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": f"{what} can't be changed after the job is created"}
    ]
    return out


def replica_spec(role: str, description: str, *, minimum: int = 0, maximum: int | None = None,
                 scalable: bool = False) -> Schema:
    """`scalable`: the MPI workers, whose count an elastic job may change (mpi_schema's rules say
    when); every other count is fixed at creation."""
    replicas = int_field(f"Number of {role} pods." + (
        " With spec.mpi.elastic, the wanted number: it may change between minReplicas and maxReplicas while "
        "the job runs (kubectl scale dtj/NAME --replicas=N)." if scalable else ""),
        minimum=minimum, default=defaults.REPLICAS)
    if maximum is not None:
        replicas["maximum"] = maximum
    if not scalable:
        replicas = immutable(replicas, f"the number of {role} replicas")
    template = FlowMapping(copy.deepcopy(pod_template_schema()))
    # What the API server would refuse in the pod anyway, refused at `kubectl apply` instead of
    # failing the job later (tests/chaos/test_fuzz_manifests.py found both): a template with no
    # spec or no container, and two containers of one name (a map keyed by name, as PodSpec is).
    template["required"] = ["spec"]
    containers = template["properties"]["spec"]["properties"]["containers"]
    containers.update({"minItems": 1, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
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
            "replicas": replicas,
            "restartPolicy": enum_field(
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
            "port": immutable(int_field("The port every TensorFlow task listens on.", minimum=1, maximum=65535,
                                    default=defaults.TF_PORT), "spec.tensorflow.port"),
            "successPolicy": immutable(enum_field(
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
            "implementation": immutable(enum_field(
                "The MPI implementation the image uses; decides the hostfile format and launcher environment.",
                [m.value for m in MPIImplementation], defaults.MPI_IMPLEMENTATION), "spec.mpi.implementation"),
            "slotsPerWorker": immutable(int_field(
                "MPI slots (processes) per worker. Default: the worker container's nvidia.com/gpu limit, else 1.",
                minimum=1), "spec.mpi.slotsPerWorker"),
            "launcher": replica_spec("launcher", "The launcher: exactly one pod, which runs mpirun. It asks "
                                     "for no GPU unless its template does.", minimum=1, maximum=1),
            "worker": replica_spec("worker", "The workers mpirun starts ranks on (at least one).", minimum=1,
                                   scalable=True),
            "sshAuthMountPath": string_field("Where the generated SSH key, authorized_keys and ssh config are mounted.",
                                     default=defaults.MPI_SSH_AUTH_MOUNT_PATH),
            "launcherStart": enum_field(
                "WhenWorkersReady: create the launcher once every worker is Ready. Immediately: create it with "
                "the workers; mpirun's ssh retries refused connections (ConnectionAttempts=10) but not a worker "
                "name that does not resolve yet, so the launcher command must wait for its hosts itself.",
                [s.value for s in LauncherStart], defaults.MPI_LAUNCHER_START),
            "elastic": immutable(elastic_schema(), "spec.mpi.elastic"),
        },
        "x-kubernetes-validations": [
            {"rule": "has(self.elastic) || self.worker.replicas == oldSelf.worker.replicas",
             "message": "spec.mpi.worker.replicas can't be changed after the job is created, unless spec.mpi.elastic "
                        "is set", "fieldPath": ".worker.replicas"},
            {"rule": "has(self.elastic) == has(oldSelf.elastic)",
             "message": "spec.mpi.elastic can't be added or removed after the job is created"},
            {"rule": "!has(self.elastic) || (self.elastic.minReplicas <= self.worker.replicas && "
                     "self.worker.replicas <= self.elastic.maxReplicas)",
             "message": "spec.mpi.worker.replicas must be between spec.mpi.elastic.minReplicas and maxReplicas",
             "fieldPath": ".worker.replicas"},
        ],
    }


def elastic_schema() -> Schema:
    return {
        "type": "object",
        "description": "Elastic training (Horovod elastic, horovodrun --host-discovery-script): worker.replicas "
                       "may change between these bounds while the job runs, and a lost worker is replaced "
                       "without restarting the job while at least minReplicas run (docs/api.md, Elastic MPI).",
        "required": ["minReplicas", "maxReplicas"],
        "properties": {
            "minReplicas": int_field("The fewest workers the training runs with.", minimum=1),
            "maxReplicas": int_field("The most workers it may be scaled to.", minimum=1),
            "scaleDownDelaySeconds": int_field(
                "How long a worker scaled away is kept after it leaves discover_hosts.sh, for the launcher's "
                "copy to be refreshed and Horovod to drop the host at its next commit.",
                minimum=0, default=defaults.ELASTIC_SCALE_DOWN_DELAY_SECONDS),
            "belowMinGraceSeconds": int_field(
                "How long the job may run with fewer than minReplicas workers before runPolicy's restart policy "
                "takes over (a whole-job restart, counted toward backoffLimit).",
                minimum=0, default=defaults.ELASTIC_BELOW_MIN_GRACE_SECONDS),
        },
        "x-kubernetes-validations": [
            {"rule": "self.minReplicas <= self.maxReplicas", "message": "spec.mpi.elastic.minReplicas is more than "
             "maxReplicas"},
        ],
    }


def run_policy_schema() -> Schema:
    return {
        "type": "object",
        "description": "How the job is run: restarts, deadlines, cleanup, suspension and scheduling.",
        "default": {},
        "properties": {
            "backoffLimit": int_field("Restarts (pod- or job-level, and kubelet container restarts) allowed before "
                                 "the job fails.", minimum=0, default=defaults.BACKOFF_LIMIT),
            "restartScope": enum_field(
                "Pod: recreate only the failed pod. Job: delete and recreate every pod of the job. Default: Job "
                "for synchronous training (tensorflow without ps, and mpi), Pod for tensorflow with ps.",
                [s.value for s in RestartScope]),
            "activeDeadlineSeconds": {"type": "integer", "format": "int64", "minimum": 1, "description":
                                      "Seconds the job may run (from its start or resume) before it fails with "
                                      "reason DeadlineExceeded."},
            "ttlSecondsAfterFinished": {"type": "integer", "format": "int64", "minimum": 0, "description":
                                        "Seconds after the job finishes when the DistTrainJob itself (and "
                                        "everything it owns) is deleted."},
            "cleanPodPolicy": enum_field(
                "Which pods to delete when the job finishes: Running (those still running, such as parameter "
                "servers and evaluators), All, or None.", [c.value for c in CleanPodPolicy],
                defaults.CLEAN_POD_POLICY),
            "suspend": {"type": "boolean", "default": defaults.SUSPEND, "description":
                        "true: delete the job's pods and hold it in phase Suspended; false again: start afresh."},
            "scheduling": scheduling_schema(),
            "networkPolicy": immutable(network_policy_schema(), "runPolicy.networkPolicy"),
        },
    }


def network_policy_schema() -> Schema:
    return {
        "type": "object",
        "description": "Opt-in network isolation: a NetworkPolicy <job>-peers, made before the pods, lets the "
                       "job's pods accept connections only from each other. Present (even empty, {}) turns it "
                       "on; add a NetworkPolicy of your own to let more in (policies add up). Enforced only by a "
                       "network plugin that implements NetworkPolicy (Calico, Cilium, ...); elsewhere it is "
                       "stored and does nothing.",
        "properties": {
            "egress": enum_field(
                "Where the pods may connect. All: anywhere (datasets and checkpoints in object storage). "
                "PeersAndDNS: only to each other and to DNS (port 53).", [e.value for e in Egress],
                defaults.NETWORK_EGRESS),
        },
    }


def scheduling_schema() -> Schema:
    return {
        "type": "object",
        "description": "Scheduling of the job's pods.",
        "properties": {
            "schedulerName": string_field("Scheduler for every pod (for example volcano), unless a template names "
                                          "its own."),
            "gang": immutable(gang_schema(), "runPolicy.scheduling.gang"),
            "queue": string_field("Volcano queue of the job's PodGroup (gang provider Volcano; Volcano's default "
                                  "queue if unset)."),
            "priorityClassName": string_field("PriorityClass for every pod, unless a template names its own."),
        },
    }


def gang_schema() -> Schema:
    return {
        "type": "object",
        "description": "Gang scheduling: the pods created together (every pod; for MPI the workers, and the "
                       "launcher only with launcherStart Immediately) are scheduled all at once or not at all, so "
                       "jobs never hold part of the GPUs each. Present (even empty, {}) turns it on. A PodGroup is "
                       "made before the pods, deleted when the job finishes or is suspended, and made afresh on a "
                       "whole-job restart.",
        "properties": {
            "provider": enum_field(
                "Which scheduler's API: Kubernetes (scheduling.k8s.io/v1alpha2 Workload and PodGroup, kube-scheduler's "
                "GangScheduling), SchedulerPlugins (scheduling.x-k8s.io PodGroup, Coscheduling), Volcano "
                "(scheduling.volcano.sh PodGroup). Auto: the one schedulerName points at, else Kubernetes', else "
                "whichever the cluster serves; an event says which.",
                [p.value for p in GangProvider], defaults.GANG_PROVIDER),
            "minAvailable": int_field("Pods that must be scheduled together. Default: every pod created together.",
                                      minimum=1),
            "timeoutSeconds": int_field("How long the scheduler holds a partly placed gang before it lets go "
                                        "(SchedulerPlugins' scheduleTimeoutSeconds; Kubernetes waits a fixed 5 "
                                        "minutes, Volcano until resources free up).", minimum=1),
        },
    }


def gang_size_rule() -> Schema:
    """minAvailable counts pods created together: more could never be scheduled at once."""
    gang = "self.runPolicy.scheduling.gang"
    tf = " + ".join(f"(has(self.tensorflow.{t}) ? self.tensorflow.{t}.replicas : 0)"
                    for t in ("chief", "ps", "worker", "evaluator"))
    # An elastic job's gang is its fewest workers: a worker added later is scheduled on its own.
    mpi = ("(has(self.mpi.elastic) ? self.mpi.elastic.minReplicas : self.mpi.worker.replicas) + "
           "(self.mpi.launcherStart == 'Immediately' ? 1 : 0)")
    return {
        "rule": f"!has(self.runPolicy) || !has(self.runPolicy.scheduling) || !has({gang}) || "
                f"!has({gang}.minAvailable) || {gang}.minAvailable <= (has(self.tensorflow) ? {tf} : {mpi})",
        "message": "runPolicy.scheduling.gang.minAvailable is more than the pods created together (every pod; for "
                   "MPI the workers, or elastic.minReplicas of them, plus the launcher with launcherStart Immediately)",
        "fieldPath": ".runPolicy.scheduling.gang.minAvailable",
    }
