"""The progress endpoint (endpoint/server.py) against a scripted TokenReview: who may report
for which job, every refusal's code and words, the limits, and what reaches the book. The real
API server's TokenReview and pod-bound tokens: tests/integration/test_progress_reports.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from disttrain.api.observed import ObservedPod
from disttrain.api.progress import AUDIENCE, Role
from disttrain.control.progress_book import ProgressBook
from disttrain.control.progress_desk import ProgressDesk
from disttrain.endpoint import server as progress_server
from disttrain.endpoint.server import BURST, ProgressServer

JOB_UID = "job-uid"
PODS = {"uid-w0": (("ml", "mnist"), "mnist-worker-0", 0), "uid-w1": (("ml", "mnist"), "mnist-worker-1", 1),
        "uid-o0": (("ml", "other"), "other-worker-0", 0)}


def token(pod_uid: str, audience: str = AUDIENCE, expires_in: float = 3600) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    return ".".join([part({"alg": "RS256"}), part({"aud": [audience], "exp": time.time() + expires_in,
                                                   "sub": pod_uid}), "signature"])


class Reviewer:
    """A TokenReview that knows the tokens `token()` makes for the pods in PODS; and the API server's
    issuer discovery, which an older cluster (or missing RBAC) doesn't serve: `discovery`, by path
    (tests/unit/test_progress_tokens.py serves a signing key's)."""

    def __init__(self, discovery: dict[str, Any] | None = None) -> None:
        self.reviews, self.reads, self.discovery = 0, 0, discovery

    async def read(self, url_path: str) -> Any:
        from disttrain.apiserver.rest import ApiError

        self.reads += 1
        if self.discovery is None or url_path not in self.discovery:
            raise ApiError(404, "Not Found")
        return self.discovery[url_path]

    async def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]:
        self.reviews += 1
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        found = PODS.get(claims["sub"])
        if found is None or audiences != [AUDIENCE]:
            return {"authenticated": False, "error": "invalid bearer token"}
        return {"authenticated": True, "audiences": audiences, "user": {
            "username": f"system:serviceaccount:{found[0][0]}:default",
            "extra": {"authentication.kubernetes.io/pod-name": [found[1]],
                      "authentication.kubernetes.io/pod-uid": [claims["sub"]]}}}


class Pods:
    def find(self, uid: str) -> tuple[tuple[str, str], ObservedPod] | None:
        found = PODS.get(uid)
        if found is None:
            return None
        key, name, index = found
        pod = ObservedPod.expected(name, _key(index), JOB_UID, uid)
        return key, pod


def _key(index: int) -> Any:
    from disttrain.api.objects import PodKey
    return PodKey("worker", index)


def role_of(key: tuple[str, str], pod: ObservedPod) -> Role | None:
    return Role.TRAINING if pod.index == 0 else None  # MultiWorkerMirrored: worker 0 reports


Scenario = Callable[[TestClient[Any, Any], ProgressServer, ProgressBook, Reviewer], Awaitable[None]]


def run(scenario: Scenario, sleep: Callable[[float], Awaitable[object]] | None = None) -> None:
    """`scenario` against an endpoint on a test server; throttled answers are held with `sleep`
    (by default not at all: `held` records how long each would have been)."""
    async def main() -> None:
        book, reviewer = ProgressBook(), Reviewer()
        server = ProgressServer(reviewer, ProgressDesk(Pods(), book, role_of), sleep=sleep or held_for)
        async with TestClient(TestServer(server.app())) as client:
            await scenario(client, server, book, reviewer)
    asyncio.run(main())


URL = "/apis/disttrain.dev/v1/namespaces/ml/disttrainjobs/mnist/progress"
held: list[float] = []


async def held_for(seconds: float) -> None:
    held.append(seconds)


async def post(client: TestClient[Any, Any], bearer: str | None, body: Any = None, url: str = URL) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    resp = await client.post(url, json=body if body is not None else {"epoch": 1}, headers=headers)
    return resp.status, (await resp.json())["message"]


def test_a_pods_report_reaches_its_jobs_book() -> None:
    async def scenario(client: TestClient[Any, Any], server: ProgressServer, book: ProgressBook,
                       reviewer: Reviewer) -> None:
        bearer = token("uid-w0")
        status, message = await post(client, bearer, {"epoch": 2, "totalEpochs": 4, "metrics": {"loss": 0.5}})
        assert (status, message) == (202, "accepted for ml/mnist from mnist-worker-0 (training)")
        found = book.state(("ml", "mnist"), JOB_UID)
        assert found is not None and found.training is not None
        assert found.training.report.metrics == {"loss": 0.5} and found.training.reporter == "mnist-worker-0"
        await post(client, bearer)
        assert reviewer.reviews == 1, "a token is reviewed once, then remembered"
    run(scenario)


def test_a_forged_report_for_another_job_is_refused() -> None:
    async def scenario(client: TestClient[Any, Any], server: ProgressServer, book: ProgressBook,
                       reviewer: Reviewer) -> None:
        status, message = await post(client, token("uid-o0"))  # other's pod, its own token, mnist's address
        assert status == 403
        assert message == ("pod ml/other-worker-0 belongs to job other, not mnist: a pod reports for its own job "
                           "only")
        assert book.state(("ml", "mnist"), JOB_UID) is None
    run(scenario)


def test_refusals_say_why() -> None:
    async def scenario(client: TestClient[Any, Any], server: ProgressServer, book: ProgressBook,
                       reviewer: Reviewer) -> None:
        assert (await post(client, None))[0] == 401
        assert (await post(client, "not-a-jwt"))[0] == 401
        assert (await post(client, token("uid-w0", audience="https://kubernetes.default.svc")))[0] == 401
        assert (await post(client, token("uid-w0", expires_in=-10)))[0] == 401
        assert reviewer.reviews == 0, "garbage and other audiences never reach the API server"
        status, message = await post(client, token("uid-w1"))
        assert status == 403 and "its chief (or worker 0), evaluator or MPI rank 0 does" in message
        status, message = await post(client, token("uid-w0"), {"epoch": "three"})
        assert status == 400 and message.startswith("invalid report: epoch must be a whole number")
        resp = await client.post(URL, data=b"{" + b" " * 20000 + b"}",
                                 headers={"Authorization": f"Bearer {token('uid-w0')}"})
        assert resp.status == 413
        assert await post(client, token("uid-gone")) == (401, "token refused: invalid bearer token")
    run(scenario)


def test_a_flood_from_one_pod_is_throttled_with_retry_after() -> None:
    async def scenario(client: TestClient[Any, Any], server: ProgressServer, book: ProgressBook,
                       reviewer: Reviewer) -> None:
        bearer = token("uid-w0")
        codes = [(await post(client, bearer))[0] for _ in range(int(BURST) + 5)]
        assert codes.count(202) == BURST and codes[-1] == 429
        resp = await client.post(URL, json={"epoch": 1}, headers={"Authorization": f"Bearer {bearer}"})
        assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
        assert (await post(client, token("uid-o0")))[0] == 403, "another pod is not held back by it"
    run(scenario)


def test_a_throttled_answer_is_held_until_the_token_may_report_again() -> None:
    """A client that ignores Retry-After gets its 429 after the bucket's wait (at most MAX_HOLD),
    so a connection carries one throttled report per hold instead of as many as it can send."""
    held.clear()

    async def scenario(client: TestClient[Any, Any], server: ProgressServer, book: ProgressBook,
                       reviewer: Reviewer) -> None:
        bearer = token("uid-w0")
        codes = [(await post(client, bearer))[0] for _ in range(int(BURST) + 3)]
        assert codes.count(429) == 3
        assert (await post(client, None))[0] == 401
    run(scenario)
    assert len(held) == 3, "each throttled answer held; a refusal for another reason is not"
    assert all(0.3 < seconds <= progress_server.MAX_HOLD for seconds in held), held


def test_held_answers_are_bounded_past_which_they_are_given_at_once(monkeypatch: Any) -> None:
    monkeypatch.setattr(progress_server, "HELD_PER_TOKEN", 2)
    release = asyncio.Event()
    holding: list[float] = []

    async def gated(seconds: float) -> None:
        holding.append(seconds)
        await release.wait()

    async def scenario(client: TestClient[Any, Any], server: ProgressServer, book: ProgressBook,
                       reviewer: Reviewer) -> None:
        bearer = token("uid-w0")
        for _ in range(int(BURST)):
            assert (await post(client, bearer))[0] == 202
        waiting = [asyncio.create_task(post(client, bearer)) for _ in range(2)]
        while len(holding) < 2:
            await asyncio.sleep(0.01)
        assert (await post(client, bearer))[0] == 429, "past the bound: answered at once"
        assert len(holding) == 2 and server.held_total == 2
        assert abs(holding[1] - holding[0] - 1 / progress_server.RATE) < 0.1, f"held in turn: {holding}"
        release.set()
        assert [status for status, _ in await asyncio.gather(*waiting)] == [429, 429]
        assert server.held == {} and server.held_total == 0
    run(scenario, sleep=gated)


def test_new_tokens_are_reviewed_at_a_bounded_rate(monkeypatch: Any) -> None:
    """The API server's side: however many good new tokens come, at most the review budget a
    second reach its TokenReview (forged ones: tests/unit/test_progress_hardening.py)."""
    monkeypatch.setattr(progress_server, "REVIEW_BURST", 3.0)
    monkeypatch.setattr(progress_server, "SOURCE_REVIEW_BURST", 100.0)

    async def scenario(client: TestClient[Any, Any], server: ProgressServer, book: ProgressBook,
                       reviewer: Reviewer) -> None:
        codes = [(await post(client, token("uid-w0", expires_in=3600 + i)))[0] for i in range(6)]
        assert codes[:3] == [202, 202, 202] and codes[3:] == [503, 503, 503]
        assert reviewer.reviews == 3
    run(scenario)
