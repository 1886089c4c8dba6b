"""The opt-in NetworkPolicy of a job (runPolicy.networkPolicy, kubeflow/trainer#3120: peers that
anyone in the cluster can reach, TensorFlow's gRPC servers and MPI's sshd included).

The policy selects the job's pods by their job-name label and lets in only pods of the same
label; with egress PeersAndDNS they may also connect only to each other, to port 53, and to the
operator's progress endpoint where it runs in pods (the chart's; their reporter reports there). DNS is
allowed to any destination, not to a kube-dns selector: node-local DNS caches listen on a link-
local address no pod selector matches. A NetworkPolicy is enforced by the network plugin, not by
the API server: on a plugin without NetworkPolicy it is stored, validated, and does nothing (the
local real node enforces it with kube-router's firewall: hack/netpolicy.py, tests/e2e)."""

from __future__ import annotations

from typing import Any

from disttrain.api.objects import JobRef, object_meta
from disttrain.api.spec import Egress, JobSpec
from disttrain.builders.naming import job_labels, network_policy_name
from disttrain.builders.progress import EndpointPods

DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def policies(ref: JobRef, spec: JobSpec, endpoint: EndpointPods | None = None) -> list[dict[str, Any]]:
    """The job's NetworkPolicy, if it asked for one. `endpoint`: the progress endpoint's pods."""
    isolation = spec.run_policy.network_policy
    if isolation is None:
        return []
    peers = [{"podSelector": {"matchLabels": job_labels(ref.name)}}]
    body: dict[str, Any] = {
        "podSelector": {"matchLabels": job_labels(ref.name)},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": peers}],
    }
    if isolation.egress is Egress.PEERS_AND_DNS:
        body["policyTypes"].append("Egress")
        body["egress"] = [{"to": peers}, {"ports": DNS_PORTS}, *endpoint_egress(endpoint)]
    return [{
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(ref, network_policy_name(ref.name), job_labels(ref.name)),
        "spec": body,
    }]


def endpoint_egress(endpoint: EndpointPods | None) -> list[dict[str, Any]]:
    """To the progress endpoint's pods on its port (a Service's address is translated to the pod's
    before the policy is applied, so the pods are what the rule names)."""
    if endpoint is None:
        return []
    where = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": endpoint.namespace}},
             "podSelector": {"matchLabels": dict(endpoint.labels)}}
    return [{"to": [where], "ports": [{"protocol": "TCP", "port": endpoint.port}]}]
