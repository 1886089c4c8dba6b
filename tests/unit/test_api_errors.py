"""API errors told apart by the API server's Status body, not by the HTTP code alone (issue 21,
defect 4): a webhook's denial answered 400 is a refusal that may pass, not an invalid pod; a 403
says whether a quota, admission or the operator's own RBAC refused, and the message says which."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from disttrain.apiserver.api_errors import ErrorKind, classify
from disttrain.apiserver.kube import Invalid, Kube, Refused
from disttrain.apiserver.rest import ApiError

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mnist-worker-0", "namespace": "ml"}}


def status(code: int, message: str, reason: str = "", **details: Any) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                       "reason": reason, "code": code, **({"details": details} if details else {})}).encode()


WEBHOOK_400 = status(400, 'admission webhook "validate.kyverno.svc-fail" denied the request: policy require-labels: '
                          "label team is required")
DECODE_400 = status(400, 'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular '
                         "expression", "BadRequest")
INVALID_422 = status(422, 'Pod "mnist-worker-0" is invalid: spec.containers[0].image: Required value', "Invalid")
RBAC_403 = status(403, 'pods is forbidden: User "system:serviceaccount:disttrain:disttrain-operator" cannot create '
                       'resource "pods" in API group "" in the namespace "ml"', "Forbidden")
QUOTA_403 = status(403, 'pods "mnist-worker-0" is forbidden: exceeded quota: gpu, requested: nvidia.com/gpu=1, '
                        "used: nvidia.com/gpu=8, limited: nvidia.com/gpu=8", "Forbidden")
PSA_403 = status(403, 'pods "mnist-worker-0" is forbidden: violates PodSecurity "restricted:latest": '
                      "allowPrivilegeEscalation != false", "Forbidden")


@pytest.mark.parametrize(("code", "body", "kind"), [
    (400, WEBHOOK_400, ErrorKind.WEBHOOK), (400, DECODE_400, ErrorKind.INVALID), (422, INVALID_422, ErrorKind.INVALID),
    (403, RBAC_403, ErrorKind.RBAC), (403, QUOTA_403, ErrorKind.QUOTA), (403, PSA_403, ErrorKind.ADMISSION),
    (409, status(409, "exists", "AlreadyExists"), ErrorKind.EXISTS), (409, status(409, "changed", "Conflict"),
                                                                         ErrorKind.CONFLICT),
    (429, status(429, "too many requests", "TooManyRequests"), ErrorKind.THROTTLED),
    (500, status(500, "etcdserver: request timed out", "InternalError"), ErrorKind.SERVER),
    (503, b"<html>unavailable</html>", ErrorKind.SERVER),
], ids=["webhook-400", "decode-400", "invalid-422", "rbac-403", "quota-403", "podsecurity-403", "exists-409",
        "conflict-409", "throttled-429", "server-500", "not-json-503"])
def test_each_kind_is_told_apart(code: int, body: bytes, kind: ErrorKind) -> None:
    assert classify(code, body).kind is kind


class Answering:
    """The one request Kube.create makes for a pod, answered with an API error."""

    def __init__(self, code: int, body: bytes) -> None:
        self.code, self.body = code, body

    async def request(self, method: str, url_path: str, **_: Any) -> Any:
        assert (method, url_path) == ("POST", "/api/v1/namespaces/ml/pods")
        raise ApiError(self.code, "", self.body)


def create(code: int, body: bytes) -> None:
    kube = Kube(Answering(code, body))  # type: ignore[arg-type]
    asyncio.run(kube.create(POD))


def test_a_webhooks_400_is_a_refusal_that_may_pass_naming_the_webhook() -> None:
    with pytest.raises(Refused, match=r'^denied by an admission webhook \(400\): admission webhook '
                                      r'"validate.kyverno.svc-fail" denied the request'):
        create(400, WEBHOOK_400)


def test_a_pod_the_api_cant_decode_is_invalid() -> None:
    with pytest.raises(Invalid, match="cannot be handled as a Pod"):
        create(400, DECODE_400)


@pytest.mark.parametrize(("body", "said"), [(RBAC_403, "forbidden by RBAC (403): pods is forbidden: User"),
                                            (QUOTA_403, "refused by a ResourceQuota (403): pods"),
                                            (PSA_403, "refused by admission (403): pods")],
                         ids=["rbac", "quota", "podsecurity"])
def test_a_403_says_who_refused(body: bytes, said: str) -> None:
    with pytest.raises(Refused, match=f"^{re.escape(said)}"):
        create(403, body)


@pytest.mark.parametrize(("code", "body", "headers", "said", "wait"), [
    (429, status(429, "too many requests", "TooManyRequests"), {"Retry-After": "2"}, "throttled (429)", 2.0),
    (500, status(500, "etcdserver: request timed out", "InternalError"), {}, "server error (500)", 0.0),
    (403, status(403, 'pods "w" is forbidden: User "system:serviceaccount:x:y" cannot delete resource "pods"',
                 "Forbidden"), {}, "forbidden by RBAC (403)", 0.0),
    (429, status(429, "slow"), {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, "throttled (429)", 0.0),
])
def test_a_failed_pass_is_explained_in_the_api_servers_words(code: int, body: bytes, headers: dict[str, str],
                                                             said: str, wait: float) -> None:
    from disttrain.apiserver.retries import explain

    err = ApiError(code, "", body, headers)
    explained = explain(err)
    assert explained is not None and explained.what.startswith(said) and explained.wait_at_least == wait


def test_an_object_gone_meanwhile_is_said_in_the_log_but_not_told_to_the_job() -> None:
    from disttrain.apiserver.retries import explain

    err = ApiError(404, "Not Found", status(404, 'disttrainjobs.disttrain.dev "mnist" not found', "NotFound"))
    explained = explain(err)
    assert explained is not None and explained.what.startswith("not found (404)") and not explained.tell_the_job


def test_an_object_the_api_server_found_invalid_is_not_explained_away() -> None:
    from disttrain.apiserver.retries import explain

    err = ApiError(422, "Unprocessable Entity", INVALID_422)
    assert explain(err) is None and explain(KeyError("x")) is None


def test_a_create_of_a_kind_the_server_does_not_serve_is_a_refusal_told_to_the_job() -> None:
    """Issue 31: a create's 404 (1.37 serves no scheduling.k8s.io/v1alpha2) was classified NotFound,
    which a pass takes for an object gone meanwhile: never told to the job, retried for ever. Now
    a Refused, so the job's status and a Warning event say it and it is retried with backoff."""
    with pytest.raises(Refused, match=r"^not found: v1 Pod \(404\): the server could not find the requested resource"):
        create(404, status(404, "the server could not find the requested resource", "NotFound"))
