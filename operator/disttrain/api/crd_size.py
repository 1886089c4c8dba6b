"""How large a job may be, refused at `kubectl apply` above it: the most pods whose TF_CONFIG and MPI
hostfile Kubernetes and Linux accept, for the job's name (issue 45).

What grows with a job's size, and the limit each meets first:

- **TF_CONFIG** lists every chief, ps and worker in each pod's environment, one variable that Linux caps
  at 131,072 bytes (MAX_ARG_STRLEN, include/uapi/linux/binfmts.h): past it `execve` fails with E2BIG and
  no container of the job can start. Past 8 KiB the cluster is one ConfigMap the kubelet expands
  TF_CONFIG from (builders/tensorflow.py), so the pods stay small; the ConfigMap holds it with room to
  spare (1 MiB). A job whose containers all set TF_CONFIG themselves is bounded the same: the
  rules can't read every template's env within CEL's cost budget.
- **An MPI job's ConfigMap** holds the hostfile and discover_hosts.sh, one line each per worker: the API
  server refuses a ConfigMap whose data passes 1 MiB (core.MaxSecretSize, ValidateConfigMap).
- **Gloo's environment** is the same few variables for 2 workers or 10,000 (builders/gloo.py): no bound
  but MAX_REPLICAS.

The rules can see the job's name but not its namespace (CRD rules read only metadata.name and
generateName), so they count the longest namespace, 63 characters, where a line holds it. A TensorFlow
entry doesn't need it: past the size where `<pod>.<job>.<ns>.svc` fits, TF_CONFIG names each member
`<pod>.<job>` (builders/tensorflow.py), which the pod's DNS search path resolves in its own namespace.
With the longest name a 1,024th pod's hostname allows (51 characters), 1,054 TensorFlow members fit
(2,695 MPI workers); with a one-character name, 5,450 (5,547): the bound is never below 1,024. The
operator checks a job made before these rules all the same (decide/size_steps.py).
"""

from __future__ import annotations

from typing import Any

from disttrain.api.spec import CLUSTER_MEMBER_TYPES, MPIBootstrap

# One environment variable, `NAME=value` and its NUL (MAX_ARG_STRLEN: 32 pages).
MAX_ENV_BYTES = 131_072
# TF_CONFIG around its members: `TF_CONFIG={"cluster":{"chief":[...],"ps":[...],"worker":[...]},"task":
# {"type":"worker","index":1023},"environment":"cloud"}` holds under 150 bytes besides them.
TF_CONFIG_OVERHEAD = 256
# A short member entry: `"<job>-<type>-<index>.<job>:<port>",` with the longest type (worker) and
# port (5 digits): 2 x the name, the index's digits, and this.
TF_ENTRY_FIXED = len('"-worker-.:",') + 5
# An MPI job's ConfigMap: what the API server accepts in its data (1 MiB), less discover_hosts.sh's
# first line.
CONFIG_MAP_BYTES = 1_048_576 - 64
MAX_NAMESPACE = 63
# Per worker, a hostfile line `<host> slots=<n>\n` (Open MPI's, the longest) and a discover_hosts.sh
# line `echo <host>:<n>\n`, each host `<job>-worker-<i>.<job>.<ns>.svc`: 2 x (2 x the name, the index's
# digits, the namespace) and the slots' digits twice, and this.
MPI_LINES_FIXED = 2 * len("-worker-...svc") + len(" slots=\n") + len("echo :\n")
# The slots' digits where slotsPerWorker is not set (a worker's GPUs: DRA allocates at most 32 x 32;
# nvidia.com/gpu has no bound, but 10,000 GPUs in a pod is none anyone has).
GPU_SLOT_DIGITS = 4
# What makes a rule a creation's only (with optionalOldSelf); the offline check (api/admission.py),
# which sees creations only, reads the rule after it.
CREATE_ONLY = "oldSelf.hasValue() || "


def tf_members_fit(name: int, members: int) -> int:
    """How many TensorFlow members fit in one TF_CONFIG for a job name `name` characters long (the
    index digits of `members`)."""
    return (MAX_ENV_BYTES - TF_CONFIG_OVERHEAD) // (2 * name + len(str(max(members - 1, 0))) + TF_ENTRY_FIXED)


def mpi_workers_fit(name: int, workers: int, slot_digits: int) -> int:
    """How many MPI workers' lines fit in the ConfigMap, for the longest namespace."""
    per_worker = 2 * (2 * name + len(str(max(workers - 1, 0))) + MAX_NAMESPACE) + 2 * slot_digits + MPI_LINES_FIXED
    return CONFIG_MAP_BYTES // per_worker


def _tf_members(t: str) -> str:
    return " + ".join(f"(has({t}.{rtype}) ? {t}.{rtype}.replicas : 0)" for rtype in CLUSTER_MEMBER_TYPES)


def size_rules() -> list[dict[str, Any]]:
    """The rules on the whole object (they read metadata.name), in CEL's integer arithmetic only."""
    name = "size(self.metadata.name)"
    members = _tf_members("self.spec.tensorflow")
    tf_entry = f"(2 * {name} + size(string({members} - 1)) + {TF_ENTRY_FIXED})"
    tf_fit = f"({MAX_ENV_BYTES - TF_CONFIG_OVERHEAD} / {tf_entry})"
    mpi = "self.spec.mpi"
    workers = f"(has({mpi}.elastic) ? {mpi}.elastic.maxReplicas : {mpi}.worker.replicas)"
    slots = f"(has({mpi}.slotsPerWorker) ? size(string({mpi}.slotsPerWorker)) : {GPU_SLOT_DIGITS})"
    mpi_worker = (f"(2 * (2 * {name} + size(string({workers} - 1)) + {MAX_NAMESPACE}) + 2 * {slots} + "
                  f"{MPI_LINES_FIXED})")
    mpi_fit = f"({CONFIG_MAP_BYTES} / {mpi_worker})"
    # Static messages: a messageExpression's string arithmetic on metadata.name (no maxLength) is costed
    # by CEL at the request's size, and the API server refused the CRD (100x over budget, tried).
    # At creation only (optionalOldSelf: oldSelf has no value then): a rule on the whole object runs
    # again on every update of it, the operator's status writes included, and a job stored before the
    # rules that breaks one (an SSH job of 5,000 workers in a short namespace, fine, past the bound
    # that counts a 63-character one) would have every status write refused. The counts a rule reads
    # don't change after creation (replicas and maxReplicas are immutable; an elastic job's replicas
    # stay within maxReplicas, which the rule counts).
    return [
        {"rule": f"{CREATE_ONLY}!has(self.spec.tensorflow) || {members} <= {tf_fit}",
         "optionalOldSelf": True,
         "fieldPath": ".spec.tensorflow",
         "message": (
             f"too many members: TF_CONFIG lists every chief, ps and worker in each pod's environment, one "
             f"variable Linux caps at {MAX_ENV_BYTES:,} bytes (MAX_ARG_STRLEN), which holds "
             f"{MAX_ENV_BYTES - TF_CONFIG_OVERHEAD:,} / (2 x the job name's length + the highest index's digits + "
             f"{TF_ENTRY_FIXED}) of them: {tf_members_fit(51, 1024):,} with a 51-character name, "
             f"{tf_members_fit(5, 4000):,} with a 5-character one"),
         "reason": "FieldValueForbidden"},
        {"rule": f"{CREATE_ONLY}!has({mpi}) || {mpi}.bootstrap == '{MPIBootstrap.GLOO.value}' || "
                 f"!has({mpi}.worker) || {workers} <= {mpi_fit}",
         "optionalOldSelf": True,
         "fieldPath": ".spec.mpi.worker.replicas",
         "message": (
             f"too many workers: the hostfile and discover_hosts.sh list every one in a ConfigMap, which holds "
             f"at most 1 MiB: {mpi_workers_fit(51, 2000, GPU_SLOT_DIGITS):,} with a 51-character job name, "
             f"{mpi_workers_fit(5, 5000, GPU_SLOT_DIGITS):,} with a 5-character one (counting a namespace of "
             f"{MAX_NAMESPACE} characters)"),
         "reason": "FieldValueForbidden"},
    ]

