"""Where training progress comes in: an HTTPS endpoint the jobs' pods report to.

    POST /apis/disttrain.dev/v1/namespaces/<ns>/disttrainjobs/<job>/progress
    Authorization: Bearer <the pod's projected token for disttrain.dev/progress>
    {"epoch": 3, "totalEpochs": 10, "step": 1200, "totalSteps": 4000, "metrics": {"loss": 0.23}}

Who reports is the token's: the API server's TokenReview says the token is good for our audience
and names the pod it is bound to (`authentication.kubernetes.io/pod-name`, `-uid` in its extra),
and the pod watch says whose pod that is. A pod reports for its own job only, and only in its
job's reporting role (api/progress.py); nothing new is stored, and a token is useless anywhere
else. Each answer is counted by result (`disttrain_progress_reports_total`):

    202 accepted | 400 invalid report | 401 no, malformed or refused token | 403 not this job's
    reporter | 413 too large | 429 too often (Retry-After) | 503 token reviews throttled

A flood never starves reconciling: a token is limited to RATE reports a second (BURST at once)
before anything else is done with it, token reviews are cached until the token expires, and new
tokens are reviewed at most REVIEWS_PER_SECOND a second.

A throttled report's 429 is held back until its turn among the token's held reports would come
at the token's rate (at most MAX_HOLD), as the API server's priority and fairness queues a
flow's excess rather than answering it at once: a client that ignores Retry-After then gets one
answer per connection per hold, not as many as it can send, and its connections' answers are
spread out rather than all due at the same moment. Answered at once, a storm of 1,000 reports a
second over 16 connections cost the operator's event loop a quarter of a CPU in 429s, and a job
applied meanwhile reached its pods 1.23-1.29x later than without (make bench, issue 23). Held
answers are bounded per token and in all (HELD_PER_TOKEN, HELD_MAX); past them the 429 is
answered at once.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from disttrain.api.constants import GROUP, PLURAL, VERSION
from disttrain.api.observed import ObservedPod
from disttrain.api.progress import AUDIENCE, ReportError, Role, parse_report
from disttrain.apiserver.rest import ApiError
from disttrain.apiserver.retries import TRANSIENT
from disttrain.control.progress_book import ProgressBook
from disttrain.runtime import metrics

log = logging.getLogger(__name__)
JobKey = tuple[str, str]
RATE, BURST = 2.0, 10.0  # reports a second per token, sustained and at once
REVIEWS_PER_SECOND, REVIEW_BURST = 20.0, 50.0
MAX_BODY = 16 * 1024
MAX_TOKENS = 10_000  # tokens remembered (reviews and limits); the least recently used go first
REVIEW_TTL = 600.0  # a cached review stands at most this long (and never past the token's expiry)
MAX_HOLD = 1.0  # seconds a throttled report's answer is held at most
HELD_PER_TOKEN, HELD_MAX = 64, 1024  # throttled answers held at once, for one token and in all
POD_NAME, POD_UID = "authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/pod-uid"


class TokenReviewer(Protocol):
    async def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]: ...


class Pods(Protocol):
    def find(self, uid: str) -> tuple[JobKey, ObservedPod] | None: ...


@dataclass(frozen=True)
class Identity:
    namespace: str
    pod: str
    pod_uid: str
    until: float  # monotonic


class Bucket:
    """A token bucket: `rate` a second, `burst` at once."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def take(self, now: float) -> float:
        """0 if allowed now; else the seconds until it would be."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Refused(Exception):
    def __init__(self, status: int, result: str, message: str, retry_after: float | None = None,
                 throttled: str | None = None) -> None:
        super().__init__(message)
        self.status, self.result, self.message, self.retry_after = status, result, message, retry_after
        self.throttled = throttled  # the digest of a token over its rate


class ProgressServer:
    def __init__(self, reviewer: TokenReviewer, pods: Pods, book: ProgressBook,
                 role_of: Callable[[JobKey, ObservedPod], Role | None],
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self.reviewer, self.pods, self.book, self.role_of, self.clock = reviewer, pods, book, role_of, clock
        self.sleep = sleep
        self.held: dict[str, int] = {}  # throttled answers being held, by token digest
        self.held_total = 0
        self.identities: OrderedDict[str, Identity] = OrderedDict()
        self.limits: OrderedDict[str, Bucket] = OrderedDict()
        self.reviews = Bucket(REVIEWS_PER_SECOND, REVIEW_BURST, clock())
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}/progress", self.handle)
        return app

    async def start(self, port: int, ssl_context: Any, host: str = "0.0.0.0") -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, ssl_context=ssl_context).start()
        log.info("progress endpoint listening on :%d", port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        try:
            job = (request.match_info["namespace"], request.match_info["name"])
            pod, role = await self.accept(request, job)
        except Refused as refused:
            metrics.PROGRESS_REPORTS.labels(result=refused.result).inc()
            if refused.throttled is not None:
                await self._hold(refused.throttled, refused.retry_after or 0.0)
            headers = {"Retry-After": str(max(1, round(refused.retry_after)))} if refused.retry_after else None
            return web.json_response({"message": refused.message}, status=refused.status, headers=headers)
        metrics.PROGRESS_REPORTS.labels(result="accepted").inc()
        return web.json_response({"message": f"accepted for {job[0]}/{job[1]} from {pod} ({role.value})"},
                                 status=202)

    async def _hold(self, digest: str, seconds: float) -> None:
        """Wait before a throttled answer, while the holds are within bounds (the module says why)."""
        ahead = self.held.get(digest, 0)
        if ahead >= HELD_PER_TOKEN or self.held_total >= HELD_MAX:
            return
        self.held[digest] = ahead + 1
        self.held_total += 1
        try:
            await self.sleep(min(seconds + ahead / RATE, MAX_HOLD))
        finally:
            self.held_total -= 1
            self.held[digest] -= 1
            if not self.held[digest]:
                del self.held[digest]

    async def accept(self, request: web.Request, job: JobKey) -> tuple[str, Role]:
        token = bearer_token(request.headers.get("Authorization", ""))
        digest = hashlib.sha256(token.encode()).hexdigest()
        self._limit(digest)
        identity = await self._identify(token, digest)
        if request.content_length is not None and request.content_length > MAX_BODY:
            raise Refused(413, "invalid", f"a report is at most {MAX_BODY} bytes")
        try:
            report = parse_report(json.loads(await request.read()))
        except web.HTTPRequestEntityTooLarge as err:
            raise Refused(413, "invalid", f"a report is at most {MAX_BODY} bytes") from err
        except (ValueError, ReportError) as err:
            raise Refused(400, "invalid", f"invalid report: {err}") from err
        found = self.pods.find(identity.pod_uid)
        if found is None or found[1].name != identity.pod or found[0][0] != identity.namespace:
            raise Refused(403, "forbidden", f"pod {identity.namespace}/{identity.pod} is not a pod of a DistTrainJob")
        key, pod = found
        if key != job:
            log.warning("refused a report for %s/%s from pod %s/%s, a pod of job %s", *job, identity.namespace,
                        identity.pod, key[1])
            raise Refused(403, "forbidden", f"pod {identity.namespace}/{identity.pod} belongs to job {key[1]}, "
                                            f"not {job[1]}: a pod reports for its own job only")
        role = self.role_of(key, pod)
        if role is None:
            raise Refused(403, "forbidden", f"pod {identity.pod} does not report for job {key[1]}: its chief (or "
                                            "worker 0), evaluator or MPI rank 0 does")
        self.book.record(key, pod.owner_uid, role, pod.name, report, datetime.datetime.now(datetime.UTC))
        return pod.name, role

    def _limit(self, digest: str) -> None:
        now = self.clock()
        bucket = self.limits.get(digest)
        if bucket is None:
            bucket = self.limits[digest] = Bucket(RATE, BURST, now)
            if len(self.limits) > MAX_TOKENS:
                self.limits.popitem(last=False)
        self.limits.move_to_end(digest)
        wait = bucket.take(now)
        if wait:
            raise Refused(429, "throttled", f"at most {RATE:g} reports a second: try again in {wait:.1f}s", wait,
                          throttled=digest)

    async def _identify(self, token: str, digest: str) -> Identity:
        now = self.clock()
        known = self.identities.get(digest)
        if known is not None and known.until > now:
            self.identities.move_to_end(digest)
            return known
        expires = unverified_expiry(token)  # garbage never reaches the API server
        if expires is None:
            raise Refused(401, "unauthenticated", f"a bearer token for audience {AUDIENCE} is needed: the pod's "
                                                  "projected token (its progress volume's `token`)")
        wait = self.reviews.take(now)
        if wait:
            raise Refused(503, "unavailable", "too many new tokens to review: try again shortly", wait)
        try:
            review = await self.reviewer.token_review(token, [AUDIENCE])
        except (ApiError, *TRANSIENT) as err:
            log.warning("token review failed: %s", err)
            raise Refused(503, "unavailable", "the API server could not review the token: try again shortly",
                          5.0) from err
        extra = (review.get("user") or {}).get("extra") or {}
        username = str((review.get("user") or {}).get("username") or "")
        if not review.get("authenticated") or AUDIENCE not in (review.get("audiences") or ()):
            raise Refused(401, "unauthenticated", f"token refused: {review.get('error') or 'not authenticated'}")
        if not extra.get(POD_NAME) or not extra.get(POD_UID) or not username.startswith("system:serviceaccount:"):
            raise Refused(401, "unauthenticated", "the token is not bound to a pod: use the pod's projected token")
        namespace = username.split(":")[2]
        identity = Identity(namespace, extra[POD_NAME][0], extra[POD_UID][0],
                            now + min(REVIEW_TTL, max(0.0, expires - time.time())))
        self.identities[digest] = identity
        if len(self.identities) > MAX_TOKENS:
            self.identities.popitem(last=False)
        return identity


def bearer_token(header: str) -> str:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "unauthenticated", f"a bearer token for audience {AUDIENCE} is needed: the pod's "
                                              "projected token (its progress volume's `token`)")
    return token.strip()


def unverified_expiry(token: str) -> float | None:
    """The `exp` of a token shaped like a JWT for our audience, read without checking its
    signature (the TokenReview does that): a way to turn garbage away for nothing."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims: Mapping[str, Any] = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        audiences = claims.get("aud")
        expires = float(claims["exp"])
    except (ValueError, KeyError, TypeError):
        return None
    if AUDIENCE not in (audiences if isinstance(audiences, list) else [audiences]) or expires <= time.time():
        return None
    return expires
