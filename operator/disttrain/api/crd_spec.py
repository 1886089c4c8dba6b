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

from disttrain.api import defaults, topology
from disttrain.api.constants import (
    CLAIM_NAME_PATTERN,
    MANAGED_BY_DISTTRAIN,
    MANAGED_BY_MULTIKUEUE,
    MAX_CLAIMS,
    MAX_REPLICAS,
)
from disttrain.api.parse import (
    GLOO_NEEDS_COMMAND,
    GLOO_NO_LAUNCHER,
    GLOO_NOT_ELASTIC,
    GLOO_RESTART_POLICIES,
    GLOO_WHOLE_RESTARTS,
)
from disttrain.api.spec import (
    LauncherStart,
    MPIBootstrap,
    MPIImplementation,
    RestartPolicy,
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
        minimum=minimum, default=defaults.REPLICAS, maximum=MAX_REPLICAS if maximum is None else maximum)
    if not scalable:
        replicas = immutable(replicas, f"the number of {role} replicas")
    template = FlowMapping(copy.deepcopy(pod_template_schema()))
    # What the API server would refuse in the pod anyway, refused at `kubectl apply` instead of
    # failing the job later (tests/chaos/test_fuzz_manifests.py found both): a template with no
    # spec or no container, and two containers of one name (a map keyed by name, as PodSpec is).
    template["required"] = ["spec"]
    containers = template["properties"]["spec"]["properties"]["containers"]
    containers.update({"minItems": 1, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    template["properties"]["metadata"]["x-kubernetes-validations"] = topology.template_rules()
    claim_entry_rules(template["properties"]["spec"]["properties"]["resourceClaims"])
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


def claim_entry_rules(claims: Schema) -> None:
    """A DRA claim entry names a template (a claim per pod) or a claim (shared), never both or
    neither, by a DNS name; two of one name can't be told apart by a container's resources.claims.
    As the pod's API says, refused at apply instead of at the pod's create."""
    claims.update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"], "maxItems": MAX_CLAIMS})
    for field in ("resourceClaimName", "resourceClaimTemplateName"):
        claims["items"]["properties"][field].update({"pattern": CLAIM_NAME_PATTERN, "maxLength": 253})
    claims["items"]["x-kubernetes-validations"] = [{
        "rule": "has(self.resourceClaimName) != has(self.resourceClaimTemplateName)",
        "message": "a resourceClaims entry sets exactly one of resourceClaimName (a claim its pods share) and "
                   "resourceClaimTemplateName (a claim made for each pod)"}]


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
        "description": "An MPI job (Horovod or any mpirun program). bootstrap SSH: worker pods running sshd "
        "and one launcher pod that runs mpirun over them with a generated hostfile and SSH key. bootstrap Gloo "
        "(Horovod): no launcher, no SSH; each worker runs its command once per slot, with its ranks and worker "
        "0's rendezvous in the environment.",
        "required": ["worker"],
        "properties": {
            "bootstrap": immutable(enum_field(
                "How the ranks start. SSH: mpirun on the launcher starts them over SSH (any MPI program). Gloo: "
                "each worker runs its own command, one process per slot, as horovodrun --gloo would start it; "
                "worker 0 serves Horovod's rendezvous (docs/api.md, Horovod without SSH).",
                [b.value for b in MPIBootstrap], defaults.MPI_BOOTSTRAP), "spec.mpi.bootstrap"),
            "implementation": immutable(enum_field(
                "The MPI implementation the image uses; decides the hostfile format and launcher environment.",
                [m.value for m in MPIImplementation], defaults.MPI_IMPLEMENTATION), "spec.mpi.implementation"),
            "slotsPerWorker": immutable(int_field(
                "MPI slots (processes) per worker. Default: the worker container's nvidia.com/gpu limit, else 1.",
                minimum=1), "spec.mpi.slotsPerWorker"),
            "launcher": replica_spec("launcher", "The launcher: exactly one pod, which runs mpirun. It asks "
                                     "for no GPU unless its template does. Required with bootstrap SSH, absent "
                                     "with Gloo.", minimum=1, maximum=1),
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
            *gloo_rules(),
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


def gloo_rules() -> list[Schema]:
    """What each bootstrap needs of the job's replicas (the messages are parse.py's, which
    `disttrain render` gives too)."""
    gloo = f"self.bootstrap == '{MPIBootstrap.GLOO.value}'"
    spec = "self.worker.template.spec"
    command = (f"has(self.worker.template) && has({spec}) && size({spec}.containers) > 0 && "
               f"has({spec}.containers[0].command) && size({spec}.containers[0].command) > 0")
    return [
        {"rule": f"{gloo} || has(self.launcher)", "fieldPath": ".launcher", "reason": "FieldValueRequired",
         "message": "spec.mpi.launcher is required with bootstrap SSH: it runs mpirun"},
        {"rule": f"!({gloo}) || !has(self.launcher)", "fieldPath": ".launcher", "message": GLOO_NO_LAUNCHER},
        {"rule": f"!({gloo}) || !has(self.elastic)", "fieldPath": ".elastic", "message": GLOO_NOT_ELASTIC},
        {"rule": f"!({gloo}) || ({command})", "fieldPath": ".worker.template.spec.containers",
         "message": "spec.mpi.worker.template.spec.containers[0].command: " + GLOO_NEEDS_COMMAND},
        {"rule": f"!({gloo}) || self.worker.restartPolicy in {list(GLOO_RESTART_POLICIES)}",
         "fieldPath": ".worker.restartPolicy", "message": "spec.mpi.worker.restartPolicy, " + GLOO_WHOLE_RESTARTS},
    ]


def elastic_schema() -> Schema:
    return {
        "type": "object",
        "description": "Elastic training (Horovod elastic, horovodrun --host-discovery-script): worker.replicas "
                       "may change between these bounds while the job runs, and a lost worker is replaced "
                       "without restarting the job while at least minReplicas run (docs/api.md, Elastic MPI).",
        "required": ["minReplicas", "maxReplicas"],
        "properties": {
            "minReplicas": int_field("The fewest workers the training runs with.", minimum=1),
            "maxReplicas": int_field("The most workers it may be scaled to.", minimum=1, maximum=MAX_REPLICAS),
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


def managed_by_schema() -> Schema:
    """Kueue's contract for a kind it dispatches across clusters (MultiKueue, KEP-2349): the field
    is read at `.spec.managedBy`, set at creation and never changed (a job handed from one
    controller to another mid-run would run twice), and not defaulted (unset: this operator)."""
    domain = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    return {
        "type": "string", "maxLength": 63,
        "description": f"Which controller runs the job. Unset or {MANAGED_BY_DISTTRAIN}: this operator. "
                       f"{MANAGED_BY_MULTIKUEUE}: Kueue's MultiKueue dispatches it to a worker cluster (the job "
                       "needs the kueue.x-k8s.io/queue-name label); this cluster's operator queues its Workload "
                       "and makes no pod, and the status is the worker cluster's copy. Any other value: "
                       "another controller's job, left alone. Can't be added, changed or removed later.",
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "spec.managedBy can't be changed after the job is created"},
            {"rule": f"self.matches('^{domain}(\\\\.{domain})*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')",
             "message": "spec.managedBy must be a domain-prefixed path, such as kueue.x-k8s.io/multikueue"},
        ],
    }


def managed_by_rule() -> Schema:
    return {"rule": "has(self.managedBy) == has(oldSelf.managedBy)",
            "message": "spec.managedBy can't be added or removed after the job is created",
            "fieldPath": ".managedBy"}
