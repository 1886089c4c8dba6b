"""Names of the objects a job owns, and the DNS names its pods answer to."""

import re

from disttrain.api.constants import JOB_NAME_LABEL, REPLICA_INDEX_LABEL, REPLICA_TYPE_LABEL
from disttrain.api.spec import ReplicaType


def pod_name(job: str, replica_type: str, index: int) -> str:
    # MPI's launcher is a single pod and carries no index (docs/api.md: `<job>-launcher`).
    if replica_type == ReplicaType.LAUNCHER:
        return f"{job}-launcher"
    return f"{job}-{replica_type}-{index}"


def service_name(job: str) -> str:
    return job


def with_uid(name: str, uid: str) -> str:
    """`<name>-<the uid's first 8 characters>`: a name no object of the user's, and no earlier job's of
    the same name that garbage collection has yet to remove, holds (`disttrain render`'s placeholder
    uid gives `<name>` alone, or its own 8 characters)."""
    part = re.sub(r"[^a-z0-9-]", "", uid.lower())[:8].strip("-")
    return f"{name}-{part}" if part else name


def network_policy_name(job: str) -> str:
    return f"{job}-peers"


def pod_fqdn(job: str, namespace: str, replica_type: str, index: int) -> str:
    """`<pod>.<job>.<ns>.svc`: resolvable through the headless Service because every pod
    sets hostname = its name and subdomain = the job's Service."""
    return f"{pod_name(job, replica_type, index)}.{service_name(job)}.{namespace}.svc"


def job_labels(job: str) -> dict[str, str]:
    return {JOB_NAME_LABEL: job}


def replica_labels(job: str, replica_type: str, index: int) -> dict[str, str]:
    return {JOB_NAME_LABEL: job, REPLICA_TYPE_LABEL: str(replica_type), REPLICA_INDEX_LABEL: str(index)}
