"""Where training progress comes in: the HTTPS endpoint the jobs' pods report to, run in a process
of its own (progress_endpoint.py) so that nothing a pod sends can cost the controller memory or
time.

    POST /apis/disttrain.dev/v1/namespaces/<ns>/disttrainjobs/<job>/progress
    Authorization: Bearer <the pod's projected token for disttrain.dev/progress>
    {"epoch": 3, "totalEpochs": 10, "step": 1200, "totalSteps": 4000, "metrics": {"loss": 0.23}}

Who reports is the token's: the API server's TokenReview says the token is good for our audience
and names the pod it is bound to (`authentication.kubernetes.io/pod-name`, `-uid` in its extra).
Whose pod that is and whether it reports for its job is the controller's to say (progress_desk.py,
asked over progress_link.py): this module only turns away what is not a well-formed report from a
reviewed token. Each answer is counted by result (`disttrain_progress_reports_total`):

    202 accepted | 400 invalid report | 401 no, malformed or refused token | 403 not this job's
    reporter | 413 too large | 429 too often (Retry-After) | 503 token reviews throttled, or the
    controller busy

The threat model (docs/api.md, "The progress endpoint"): any pod that reaches the port, with no
credentials, sends anything. So a token is limited to RATE reports a second (BURST at once) before
anything else is done with it; a token's review is cached until it expires, a refused one is
remembered (REFUSED_TTL), costs its source REFUSAL_COST reviews of its budget and makes it a
suspect for as long; new tokens are reviewed at most SOURCE_REVIEWS_PER_SECOND a second (and
SOURCE_CONCURRENT_REVIEWS at once) from one source address, and in all REVIEWS_PER_SECOND from
sources never refused plus SUSPECT_REVIEWS_PER_SECOND from suspects. Forged tokens, from however
many pods, drain the suspects' budget after one refusal each, never the one a job's first report
is reviewed from.

A throttled report's 429 is held back until its turn among the token's held reports would come
at the token's rate (at most MAX_HOLD), as the API server's priority and fairness queues a flow's
excess: a client that ignores Retry-After then gets one answer per connection per hold. Held
answers are bounded per token and in all (HELD_PER_TOKEN, HELD_MAX); past them the 429 is answered
at once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from disttrain.api.constants import GROUP, PLURAL, VERSION
from disttrain.api.progress import AUDIENCE, ReportError, parse_report
from disttrain.watch.progress_keys import IssuerKeys, TokenRefused
from disttrain.watch.progress_limits import Bucket, Lru
from disttrain.watch.progress_link import Identity, JobKey, Refused

log = logging.getLogger(__name__)
RATE, BURST = 2.0, 10.0  # reports a second per token, sustained and at once
REVIEWS_PER_SECOND, REVIEW_BURST = 20.0, 50.0  # new tokens reviewed, in all, from sources never refused
SUSPECT_REVIEWS_PER_SECOND, SUSPECT_REVIEW_BURST = 5.0, 10.0  # in all, from sources refused lately
SOURCE_REVIEWS_PER_SECOND, SOURCE_REVIEW_BURST = 5.0, 10.0  # new tokens reviewed, from one address
SOURCE_CONCURRENT_REVIEWS = 1  # at once from one address: a forger is a suspect after its first refusal
REFUSAL_COST = 5.0  # of its source's review budget, a token the API server refused
REFUSED_TTL = 600.0  # seconds a refused token is answered 401 without a review
MAX_BODY = 16 * 1024
MAX_TOKEN = 8 * 1024  # a projected token is ~1 KB
MAX_TOKENS = 10_000  # tokens (and sources) remembered; the least recently used go first
REVIEW_TIMEOUT = 5.0  # seconds a TokenReview may take: within the listener's request deadline
REVIEW_TTL = 600.0  # a cached review stands at most this long (and never past the token's expiry)
MAX_HOLD = 1.0  # seconds a throttled report's answer is held at most
HELD_PER_TOKEN, HELD_MAX = 64, 1024  # throttled answers held at once, for one token and in all
POD_NAME, POD_UID = "authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/pod-uid"
NEEDS_TOKEN = (f"a bearer token for audience {AUDIENCE} is needed: the pod's projected token (its progress "
               "volume's `token`)")


class TokenReviewer(Protocol):
    """The API server: its TokenReview, and a GET of its issuer's keys (progress_keys.py)."""

    async def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]: ...

    async def read(self, url_path: str) -> Any: ...


class Desk(Protocol):
    """Who decides whether a reviewed pod reports for a job, and records it: the controller's
    progress_desk.py, in-process in tests, over progress_link.py in the endpoint's process."""

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
        return await self.desk.submit(identity, job, report)

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
            self.identities.move_to_end(digest)
            return known
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
            identity = identity_of(review, now + min(REVIEW_TTL, max(0.0, expires - time.time())))
        except Refused as refused:
            budget.charge(REFUSAL_COST)
            self.suspects.put(source, now + REFUSED_TTL)
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
        """The token's expiry once its signature is checked (progress_keys.py): a forged one is
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


def identity_of(review: Any, until: float) -> Identity:
    """The pod a TokenReview's answer names, or Refused."""
    review = review if isinstance(review, dict) else {}
    user = review["user"] if isinstance(review.get("user"), dict) else {}
    extra = user["extra"] if isinstance(user.get("extra"), dict) else {}
    username = str(user.get("username") or "")
    if not review.get("authenticated") or AUDIENCE not in (review.get("audiences") or ()):
        raise Refused(401, "unauthenticated", f"token refused: {str(review.get('error') or 'not authenticated')[:200]}")
    names, uids = extra.get(POD_NAME), extra.get(POD_UID)
    if not (names and uids and isinstance(names, list) and isinstance(uids, list)
            and username.startswith("system:serviceaccount:") and username.count(":") == 3):
        raise Refused(401, "unauthenticated", "the token is not bound to a pod: use the pod's projected token")
    return Identity(username.split(":")[2], str(names[0]), str(uids[0]), until)


async def read_report(request: web.Request) -> dict[str, Any]:
    """The body as a report's JSON, checked (api/progress.py), or Refused: never an exception of
    the parser's own (a 500)."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise Refused(413, "invalid", f"a report is at most {MAX_BODY} bytes")
    try:
        body = json.loads(await request.read())
        parse_report(body)
    except web.HTTPRequestEntityTooLarge as err:
        raise Refused(413, "invalid", f"a report is at most {MAX_BODY} bytes") from err
    except (ValueError, ReportError, RecursionError, OverflowError) as err:  # UnicodeDecodeError is a ValueError
        raise Refused(400, "invalid", f"invalid report: {str(err)[:300]}") from err
    return body  # type: ignore[no-any-return]  # parse_report said it is an object


def bearer_token(header: str) -> str:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or len(token) > MAX_TOKEN or not token.isascii():
        raise Refused(401, "unauthenticated", NEEDS_TOKEN)
    return token.strip()


def unverified_expiry(token: str) -> float | None:
    """The `exp` of a token shaped like a JWT for our audience, read without checking its
    signature (the TokenReview does that): a way to turn garbage away for nothing. Anything else
    (not three parts, a payload that is no JSON object, an `exp` that is no finite number) is None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        if not isinstance(claims, dict):
            return None
        audiences, expires = claims.get("aud"), claims.get("exp")
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            return None
        expires = float(expires)
    except (ValueError, binascii.Error, RecursionError, OverflowError):
        return None
    if AUDIENCE not in (audiences if isinstance(audiences, list) else [audiences]):
        return None
    return expires if math.isfinite(expires) and expires > time.time() else None
