"""Least privilege, proven from the API server's audit log (issue 12, item 7).

The session's operator runs with a token of the chart's ServiceAccount (tests/conftest.py), and
the chart's own operator runs the same way in test_helm_chart.py and from its image in the e2e
tests; the local API server audits every ServiceAccount's requests. This test runs after every
other test of the session and compares what those operators did with what the chart grants:
- any request that RBAC refused fails it, whichever tests ran;
- any grant that no request used fails it when the whole of tests/integration and tests/chaos
  ran (a part of the suite can't tell an unused grant from an untested path).
Admission refusals (a missing PriorityClass, a quota: the chaos fuzz makes them on purpose) are
not RBAC's doing; they are printed, by reason, and not counted here."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import CHART, OPERATOR_NAMESPACE, ROOT, Cluster, helm

# The chart's account in any release: session-disttrain-operator (the session's operator),
# dt-disttrain-operator (test_helm_chart.py), disttrain-operator (the e2e tests' helm install).
CHART_ACCOUNT = re.compile(r"system:serviceaccount:[^:]+:[a-z0-9-]*disttrain-operator")
Grant = tuple[str, str, str]  # API group, resource[/subresource], verb
NON_RESOURCE = "nonResourceURL"
NON_RESOURCE_URLS = {"/openid/v1/jwks"}  # the chart's nonResourceURLs grants


def granted(cluster: Cluster) -> set[Grant]:
    rendered = helm(cluster, "template", "dt", str(CHART), "--namespace", OPERATOR_NAMESPACE,
                    "--kube-version", "1.36.3", "--show-only", "templates/rbac.yaml")
    return {grant for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] in ("ClusterRole", "Role")
            for rule in doc["rules"] for grant in grants_of(rule)}


def grants_of(rule: dict[str, Any]) -> set[Grant]:
    """A rule's grants; a non-resource URL's (the issuer's keys) as (NON_RESOURCE, its path, verb)."""
    if "nonResourceURLs" in rule:
        return {(NON_RESOURCE, url, verb) for url in rule["nonResourceURLs"] for verb in rule["verbs"]}
    return {(group, resource, verb)
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def operator_requests(audit_log: Path) -> list[dict[str, Any]]:
    """The chart's account's requests: of a resource, or of a path such as /openid/v1/jwks (not
    /api, /apis or /version: discovery every client makes, which RBAC grants every account)."""
    events = (json.loads(line) for line in audit_log.read_text().splitlines() if line.strip())
    return [e for e in events if CHART_ACCOUNT.fullmatch(e["user"]["username"]) and (
        e.get("objectRef") or e.get("requestURI", "").split("?")[0] in NON_RESOURCE_URLS)]


def grant_of(event: dict[str, Any]) -> Grant:
    if not event.get("objectRef"):
        return NON_RESOURCE, event["requestURI"].split("?")[0], event["verb"]
    ref = event["objectRef"]
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return ref.get("apiGroup", ""), resource, event["verb"]


def decision(event: dict[str, Any]) -> str | None:
    """RBAC's answer to the request: allow or forbid."""
    answer = event.get("annotations", {}).get("authorization.k8s.io/decision")
    return str(answer) if answer else None


def whole_suite_ran(request: pytest.FixtureRequest) -> bool:
    if request.config.option.keyword or request.config.option.markexpr:
        return False
    ran = {Path(str(item.path)) for item in request.session.items}
    expected = {p for folder in ("integration", "chaos") for p in (ROOT / "tests" / folder).glob("test_*.py")}
    return expected <= ran


@pytest.mark.after_all
def test_the_operator_used_every_grant_of_the_chart_and_was_refused_none(
        cluster: Cluster, request: pytest.FixtureRequest) -> None:
    if cluster.local is None or not cluster.local.audit_groups:
        pytest.skip("needs the local plane's audit log (not DISTTRAIN_TEST_KUBECONFIG)")
    time.sleep(2.5)  # the audit log is written in batches, up to 1 s apart
    requests = operator_requests(cluster.local.root / "audit.log")
    assert requests, "no request of the chart's ServiceAccount was audited"
    grants = granted(cluster)
    used = Counter(grant_of(e) for e in requests if decision(e) == "allow")
    forbidden = Counter(f"{' '.join(grant_of(e))} {e['objectRef'].get('namespace', '')}/"
                        f"{e['objectRef'].get('name', '')}" for e in requests if decision(e) == "forbid")
    admission = Counter(f"{' '.join(grant_of(e))}: {e['responseStatus'].get('reason', '')} "
                        f"{e['responseStatus'].get('message', '')[:160]}"
                        for e in requests if e.get("responseStatus", {}).get("code") == 403 and decision(e) == "allow")
    print(f"\nRBAC audit: {len(requests)} requests of the chart's account; grants used:")
    for grant in sorted(grants | set(used)):
        print(f"  {used.get(grant, 0):>7}  {'/'.join(grant[:2]) if grant[0] else grant[1]} {grant[2]}"
              f"{'' if grant in grants else '  (not granted)'}")
    print("refused at admission (not RBAC):\n  " + "\n  ".join(f"{n} x {m}" for m, n in admission.most_common()))
    assert not forbidden, f"requests RBAC refused: {dict(forbidden)}"
    if not whole_suite_ran(request):
        pytest.skip("part of the suite ran: unused grants are only judged after all of it")
    unused = sorted(grants - set(used))
    assert not unused, f"grants of the chart no request used: {unused}"
