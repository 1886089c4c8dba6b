"""The opt-in NetworkPolicy (runPolicy.networkPolicy) on the real API server: made before the
pods, controlled by the job, validated by the API server, and never changed under a running job.
(Enforcement is the network plugin's: KWOK's pods have no network; on the real node kube-router's
firewall enforces it, tests/e2e/test_network_policy_enforced.py.)"""

from __future__ import annotations

import pytest
from kubernetes import client

from manifests import mwms_job
from support import Cluster, wait_pods_running

pytestmark = pytest.mark.usefixtures("operator")


def test_the_job_gets_its_network_policy_before_its_pods(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mwms_job("iso", workers=2, networkPolicy={"egress": "PeersAndDNS"}), namespace)
    pods = wait_pods_running(cluster, namespace, "iso", 2)
    policy = client.NetworkingV1Api(cluster.api).read_namespaced_network_policy("iso-peers", namespace)
    assert [(r.uid, r.controller) for r in policy.metadata.owner_references] == [
        (cluster.job(namespace, "iso")["metadata"]["uid"], True)]
    assert policy.spec.pod_selector.match_labels == {"disttrain.dev/job-name": "iso"}
    assert policy.spec.policy_types == ["Ingress", "Egress"]
    assert policy.metadata.creation_timestamp <= min(p.metadata.creation_timestamp for p in pods)
    changed = cluster.kubectl("patch", "dtj", "iso", "-n", namespace, "--type=merge", "-p",
                              '{"spec":{"runPolicy":{"networkPolicy":{"egress":"All"}}}}', check=False)
    assert changed.returncode != 0 and "runPolicy.networkPolicy can't be changed" in changed.stderr, changed.stderr


def test_a_network_policy_of_that_name_not_the_jobs_fails_the_job(cluster: Cluster, namespace: str) -> None:
    client.NetworkingV1Api(cluster.api).create_namespaced_network_policy(namespace, {
        "metadata": {"name": "taken-peers"}, "spec": {"podSelector": {}}})
    cluster.apply(mwms_job("taken", workers=1, networkPolicy={}), namespace)
    status = cluster.wait_phase(namespace, "taken", "Failed")
    assert status["reason"] == "ObjectNotOwned"
    assert f"NetworkPolicy {namespace}/taken-peers already exists" in status["message"]
    assert not cluster.pods(namespace, "disttrain.dev/job-name=taken")
