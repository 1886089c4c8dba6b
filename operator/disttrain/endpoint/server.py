"""Where training progress comes in: the HTTPS endpoint the jobs' pods report to, run in a process
of its own (endpoint/process.py) so that nothing a pod sends can cost the controller memory or
time.

    POST /apis/disttrain.dev/v1/namespaces/<ns>/disttrainjobs/<job>/progress
    Authorization: Bearer <the pod's projected token for disttrain.dev/progress>
    {"epoch": 3, "totalEpochs": 10, "step": 1200, "totalSteps": 4000, "metrics": {"loss": 0.23}}

Who reports is the token's: the API server's TokenReview says the token is good for our audience
and names the pod it is bound to (`authentication.kubernetes.io/pod-name`, `-uid` in its extra).
Whose pod that is and whether it reports for its job is the controller's to say (control/progress_desk.py,
asked over runtime/progress_link.py): this module only turns away what is not a well-formed report from a
reviewed token. Each answer is counted by result (`disttrain_progress_reports_total`):

    202 accepted | 400 invalid report | 401 no, malformed or refused token | 403 not this job's
    reporter | 413 too large | 429 too often (Retry-After) | 503 token reviews throttled, or the
    controller busy

The threat model (docs/api.md, "The progress endpoint"): any pod that reaches the port, with no
credentials, sends anything. So a token is limited to RATE reports a second (BURST at once) before
anything else is done with it; its signature is checked against the issuer's keys
(endpoint/keys.py), so a forged one is refused for nothing; a token's review is cached while
reports keep coming (REVIEW_TTL past the last, never past its expiry); a refused one is remembered
(REFUSED_TTL). A refusal by the API server costs its source REFUSAL_COST reviews of its budget and
makes it a suspect for as long, as does a reviewed token whose pod doesn't report for the job it
names (the desk's 403: anyone can mint pod-bound tokens for their own pods). New tokens are
reviewed at most SOURCE_REVIEWS_PER_SECOND a second (and SOURCE_CONCURRENT_REVIEWS at once) from
one source address, and in all REVIEWS_PER_SECOND from sources never refused plus
SUSPECT_REVIEWS_PER_SECOND from suspects: others' tokens drain the suspects' budget after one
refusal an address, never the one a job's first report is reviewed from.

A throttled report's 429 is held back until its turn among the token's held reports would come
at the token's rate (at most MAX_HOLD), as the API server's priority and fairness queues a flow's
excess: a client that ignores Retry-After then gets one answer per connection per hold. Held
answers are bounded per token and in all (HELD_PER_TOKEN, HELD_MAX); past them the 429 is answered
at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from aiohttp import web

from disttrain.api.constants import GROUP, PLURAL, VERSION
from disttrain.api.progress import AUDIENCE
from disttrain.endpoint.checks import (
    MAX_BODY,
    NEEDS_TOKEN,
    bearer_token,
    identity_of,
    read_report,
    unverified_expiry,
)
from disttrain.endpoint.keys import IssuerKeys, TokenRefused
from disttrain.endpoint.limits import Bucket, Lru
from disttrain.runtime.progress_link import Identity, JobKey, Refused

log = logging.getLogger(__name__)
RATE, BURST = 2.0, 10.0  # reports a second per token, sustained and at once
REVIEWS_PER_SECOND, REVIEW_BURST = 20.0, 50.0  # new tokens reviewed, in all, from sources never refused
SUSPECT_REVIEWS_PER_SECOND, SUSPECT_REVIEW_BURST = 5.0, 10.0  # in all, from sources refused lately
SOURCE_REVIEWS_PER_SECOND, SOURCE_REVIEW_BURST = 5.0, 10.0  # new tokens reviewed, from one address
SOURCE_CONCURRENT_REVIEWS = 1  # at once from one address: a forger is a suspect after its first refusal
REFUSAL_COST = 5.0  # of its source's review budget, a token the API server refused
REFUSED_TTL = 600.0  # seconds a refused token is answered 401 without a review
MAX_TOKENS = 10_000  # tokens (and sources) remembered; the least recently used go first
REVIEW_TIMEOUT = 5.0  # seconds a TokenReview may take: within the listener's request deadline
REVIEW_TTL = 600.0  # a cached review stands at most this long (and never past the token's expiry)
MAX_HOLD = 1.0  # seconds a throttled report's answer is held at most
HELD_PER_TOKEN, HELD_MAX = 64, 1024  # throttled answers held at once, for one token and in all


class TokenReviewer(Protocol):
    """The API server: its TokenReview, and a GET of its issuer's keys (endpoint/keys.py)."""

    async def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]: ...

    async def read(self, url_path: str) -> Any: ...


class Desk(Protocol):
    """Who decides whether a reviewed pod reports for a job, and records it: the controller's
    control/progress_desk.py, in-process in tests, over runtime/progress_link.py in the endpoint's process."""

    async def submit(self, identity: Identity, job: JobKey, report: dict[str, Any]) -> str: ...


class ProgressServer:
    def __init__(self, reviewer: TokenReviewer, desk: Desk, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self.reviewer, self.desk, self.clock, self.sleep = reviewer, desk, clock, sleep
        self.counts: Counter[str] = Counter()  # answers by result, since the last `take_counts`
        self.answered: Callable[[web.BaseRequest], None] = lambda request: None  # the listener's deadlines
        self.held: dict[str, int] = {}  # throttled answers being held, by token digest
        self.held_total = 0
        self.identities, self.refused, self.limits = Lru(MAX_TOKENS), Lru(MAX_TOKENS), Lru(MAX_TOKENS)
        self.sources = Lru(MAX_TOKENS)  # review budgets by source address
        self.suspects = Lru(MAX_TOKENS)  # source address -> until when its tokens share the suspects' budget
        self.not_reporters = Lru(MAX_TOKENS)  # digests of reviewed tokens the desk refused (403)
        self.reviewing: Counter[str] = Counter()  # reviews in flight, by source address
        self.reviews = Bucket(REVIEWS_PER_SECOND, REVIEW_BURST, clock())
        self.suspect_reviews = Bucket(SUSPECT_REVIEWS_PER_SECOND, SUSPECT_REVIEW_BURST, clock())
        self.keys = IssuerKeys(reviewer.read, clock)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}/progress", self.handle)
        return app

    def take_counts(self) -> dict[str, int]:
        counts, self.counts = dict(self.counts), Counter()
        return counts

    async def handle(self, request: web.Request) -> web.Response:
        try:
            return await self._answer(request)
        finally:
            self.answered(request)

    async def _answer(self, request: web.Request) -> web.Response:
        job = (request.match_info["namespace"], request.match_info["name"])
        try:
            message = await self.accept(request, job)
        except Refused as refused:
            self.counts[refused.result] += 1
            if refused.throttled is not None:
                await self._hold(refused.throttled, refused.retry_after or 0.0)
            headers = {"Retry-After": str(max(1, math.ceil(refused.retry_after)))} if refused.retry_after else None
            return closing(web.json_response({"message": refused.message}, status=refused.status, headers=headers))
        except Exception as err:  # what no check above foresaw (a body's encoding, say): a 400, counted
            self.counts["invalid"] += 1
            log.debug("progress endpoint: %s: %s", type(err).__name__, err)
            return closing(web.json_response({"message": f"invalid request: {type(err).__name__}"}, status=400))
        self.counts["accepted"] += 1
        return web.json_response({"message": message}, status=202)

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

    async def accept(self, request: web.Request, job: JobKey) -> str:
        token = bearer_token(request.headers.get("Authorization", ""))
        digest = hashlib.sha256(token.encode()).hexdigest()
        self._limit(digest)
        identity = await self._identify(token, digest, request.remote or "")
        report = await read_report(request)
        try:
            return await self.desk.submit(identity, job, report)
        except Refused as refused:
            # Not a reporter of this job: its review was spent for nothing, and minting pod-bound
            # tokens for one's own pods is free. Its address pays as for a refused token, once a token.
            if refused.status == 403 and self.not_reporters.get(digest) is None:
                self.not_reporters.put(digest, True)
                self._suspect(request.remote or "", self.clock())
            raise

    def _suspect(self, source: str, now: float) -> None:
        """A refusal counts against its address: REFUSAL_COST of its review budget, and its new
        tokens share the suspects' budget for REFUSED_TTL."""
        if (budget := self.sources.get(source)) is not None:
            budget.charge(REFUSAL_COST)
        self.suspects.put(source, now + REFUSED_TTL)

    def _limit(self, digest: str) -> None:
        now = self.clock()
        bucket = self.limits.get(digest) or Bucket(RATE, BURST, now)
        self.limits.put(digest, bucket)
        wait = bucket.take(now)
        if wait:
            raise Refused(429, "throttled", f"at most {RATE:g} reports a second: try again in {wait:.1f}s", wait,
                          throttled=digest)

    async def _identify(self, token: str, digest: str, source: str) -> Identity:
        now = self.clock()
        known: Identity | None = self.identities.get(digest)
        if known is not None and known.until > now:
            # Reports keep coming: the review stands REVIEW_TTL from the last (never past the token's
            # expiry), so a reporter needs no new review, and no budget, in the middle of a checkpoint.
            return self.identities.put(digest, replace(known, until=min(now + REVIEW_TTL, known.expires)))  # type: ignore[no-any-return]
        if (refusal := self.refused.get(digest)) is not None and refusal[0] > now:
            raise Refused(401, "unauthenticated", refusal[1])
        expires = await self._expiry(token, digest, now)
        budget = self.sources.get(source) or Bucket(SOURCE_REVIEWS_PER_SECOND, SOURCE_REVIEW_BURST, now)
        self.sources.put(source, budget)
        suspect = self.suspects.get(source, 0.0) > now  # a token from it was refused lately
        busy = self.reviewing[source] >= SOURCE_CONCURRENT_REVIEWS and 1.0
        wait = busy or budget.take(now) or (self.suspect_reviews if suspect else self.reviews).take(now)
        if wait:
            raise Refused(503, "unavailable", "too many new tokens to review: try again shortly", wait)
        self.reviewing[source] += 1
        try:
            review = await asyncio.wait_for(self.reviewer.token_review(token, [AUDIENCE]), REVIEW_TIMEOUT)
            expires_at = now + max(0.0, expires - time.time())
            identity = identity_of(review, min(now + REVIEW_TTL, expires_at), expires_at)
        except Refused as refused:
            self._suspect(source, now)
            self.refused.put(digest, (now + REFUSED_TTL, refused.message))
            raise
        except Exception as err:  # the API server's trouble, or our credentials' (ApiError, timeouts, login)
            log.warning("token review failed: %s: %s", type(err).__name__, err)
            raise Refused(503, "unavailable", "the API server could not review the token: try again shortly",
                          5.0) from err
        finally:
            self.reviewing[source] -= 1
            if not self.reviewing[source]:
                del self.reviewing[source]
        self.identities.put(digest, identity)
        return identity


    async def _expiry(self, token: str, digest: str, now: float) -> float:
        """The token's expiry once its signature is checked (endpoint/keys.py): a forged one is
        refused here, costing its source no review and no budget. Where the issuer's keys can't be
        read, the unverified expiry of a token for our audience (garbage never reaches the API server)."""
        try:
            expires = await self.keys.check(token)
        except TokenRefused as refused:
            if refused.retry_after is not None:
                raise Refused(503, "unavailable", refused.message, refused.retry_after) from refused
            self.refused.put(digest, (now + REFUSED_TTL, refused.message))
            raise Refused(401, "unauthenticated", refused.message) from refused
        expires = unverified_expiry(token) if expires is None else expires
        if expires is None:
            raise Refused(401, "unauthenticated", NEEDS_TOKEN)
        return expires


def closing(response: web.Response) -> web.Response:
    """A refusal ends its connection: only a reporting pod's accepted reports keep one open (at most
    KEEPALIVE), so refused requests can't hold the listener's connections by answering fast."""
    response.force_close()
    return response
