"""An MPI job's SSH private key appears in its Secret and nowhere else (issue 12, item 7): not in the
operator's log, the namespace's events, the job's status, its pods, its ConfigMap, or what
`disttrain render` prints for the same manifest. A job that fails and restarts is included: the
messages of a failure are where a careless operator would quote its objects."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import yaml
from chaos_support import mpi_small

from disttrain.builders.mpi import SSH_KEY
from support import Cluster, OperatorProcess, wait_for, wait_pods_running


def test_the_ssh_private_key_is_only_in_its_secret(cluster: Cluster, operator: OperatorProcess,
                                                    namespace: str) -> None:
    name = "keyed"
    manifest = mpi_small(name)
    cluster.apply(manifest, namespace)
    wait_pods_running(cluster, namespace, name, 3)
    cluster.finish_pod(namespace, f"{name}-worker-1", 137)  # a restart: events and messages are written
    wait_for(lambda: cluster.job_status(namespace, name).get("restarts") == 1, 30, "the restart")
    wait_pods_running(cluster, namespace, name, 3)

    secret = cluster.core.read_namespaced_secret(cluster.job_status(namespace, name)["sshSecret"], namespace)
    private = base64.b64decode(secret.data[SSH_KEY]).decode()
    assert "PRIVATE KEY" in private
    # Any line of the key's body is proof enough of a leak; the armour lines are not.
    secret_lines = [line for line in private.splitlines() if line and "PRIVATE KEY" not in line]
    assert secret_lines

    api = cluster.api
    places = {
        "operator log": operator.log(),
        "events": json.dumps(api.sanitize_for_serialization(cluster.core.list_namespaced_event(namespace))),
        "job": json.dumps(cluster.job(namespace, name)),
        "pods": json.dumps(api.sanitize_for_serialization(cluster.core.list_namespaced_pod(namespace))),
        "configmaps": json.dumps(api.sanitize_for_serialization(cluster.core.list_namespaced_config_map(namespace))),
        "render": subprocess.run([sys.executable, "-m", "disttrain", "render", "-"], input=yaml.safe_dump(manifest),
                                 capture_output=True, text=True, check=True).stdout,
    }
    leaked = [where for where, text in places.items() if any(line in text for line in secret_lines)]
    assert not leaked, f"the private key appears in: {leaked}"
