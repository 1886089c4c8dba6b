"""The opt-in NetworkPolicy (runPolicy.networkPolicy): built only when asked, selecting the job's
pods and letting in only each other; PeersAndDNS also keeps their connections to peers and DNS."""

from __future__ import annotations

import pytest

from disttrain.api.objects import JobRef
from disttrain.api.parse import parse_spec
from disttrain.builders.network import policies
from disttrain.builders.progress import EndpointPods
from disttrain.builders.render import render_objects
from manifests import mpi_job, mwms_job

REF = JobRef("mnist", "ml", "uid-1")
PEERS = [{"podSelector": {"matchLabels": {"disttrain.dev/job-name": "mnist"}}}]


def test_no_policy_unless_asked() -> None:
    assert policies(REF, parse_spec(mwms_job("mnist", workers=2)["spec"])) == []


def test_peers_only_in_and_anywhere_out_by_default() -> None:
    (policy,) = policies(REF, parse_spec(mwms_job("mnist", workers=2, networkPolicy={})["spec"]))
    assert policy["metadata"]["name"] == "mnist-peers"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert policy["spec"] == {"podSelector": PEERS[0]["podSelector"], "policyTypes": ["Ingress"],
                              "ingress": [{"from": PEERS}]}


def test_peers_and_dns_out() -> None:
    (policy,) = policies(REF, parse_spec(mwms_job("mnist", workers=2, networkPolicy={"egress": "PeersAndDNS"})["spec"]))
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == [{"to": PEERS}, {"ports": [{"protocol": "UDP", "port": 53},
                                                                  {"protocol": "TCP", "port": 53}]}]


def test_render_shows_it_before_the_pods() -> None:
    job = mpi_job("hvd", workers=2, gpus=1)
    job["spec"]["runPolicy"] = {"networkPolicy": {}}
    kinds = [o["kind"] for o in render_objects(job)]
    assert "NetworkPolicy" in kinds and kinds.index("NetworkPolicy") < kinds.index("Pod")


ENDPOINT = EndpointPods("disttrain-system", (("app.kubernetes.io/name", "disttrain-operator"),
                                             ("app.kubernetes.io/instance", "disttrain")), 8443)


def test_peers_and_dns_out_still_reach_the_charts_progress_endpoint() -> None:
    """Issue 32: enforced on the real node, PeersAndDNS kept the reporter from the operator's
    endpoint (its Service address is translated to the operator's pod before the policy applies).
    The pods serving it get an egress rule of their own, on its port only."""
    spec = parse_spec(mwms_job("mnist", workers=2, networkPolicy={"egress": "PeersAndDNS"})["spec"])
    (policy,) = policies(REF, spec, ENDPOINT)
    assert policy["spec"]["egress"][2] == {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "disttrain-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "disttrain-operator",
                                                "app.kubernetes.io/instance": "disttrain"}}}],
        "ports": [{"protocol": "TCP", "port": 8443}]}
    (default,) = policies(REF, parse_spec(mwms_job("mnist", workers=2, networkPolicy={})["spec"]), ENDPOINT)
    assert "egress" not in default["spec"], "egress All needs no rule"


def test_progress_pods_is_parsed_or_refused_at_start_up() -> None:
    from disttrain.__main__ import _endpoint_pods

    assert _endpoint_pods("ops/app.kubernetes.io/name=disttrain-operator,app.kubernetes.io/instance=d", 8443) == \
        EndpointPods("ops", (("app.kubernetes.io/name", "disttrain-operator"), ("app.kubernetes.io/instance", "d")),
                     8443)
    assert _endpoint_pods("ops/tier=", 1).labels == (("tier", ""),), "an empty value is a value"
    for bad in ("ops", "/a=b", "ops/", "ops/a", "ops/=b", "ops/a=b,c", "ops/a=b,", "Ops/a=b", "ops/a=b c",
                "ops/a b=c", "ops/-a=b", "ops/a=" + "v" * 64, "ops/Example.COM/a=b"):
        with pytest.raises(SystemExit, match="expected NAMESPACE/KEY=VALUE"):
            _endpoint_pods(bad, 8443)
