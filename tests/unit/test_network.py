"""The opt-in NetworkPolicy (runPolicy.networkPolicy): built only when asked, selecting the job's
pods and letting in only each other; PeersAndDNS also keeps their connections to peers and DNS."""

from __future__ import annotations

from disttrain.api.objects import JobRef
from disttrain.api.spec import parse_spec
from disttrain.builders.network import policies
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
