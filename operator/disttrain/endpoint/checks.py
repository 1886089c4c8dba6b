"""What a report's request carries, checked before and after its token's review: the bearer token,
its expiry unverified (where the issuer's keys can't be read, endpoint/keys.py), the pod a review
names, and the body as a report. Each says no with Refused, never an exception of a parser's own."""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from typing import Any

from aiohttp import web

from disttrain.api.progress import AUDIENCE, ReportError, parse_report
from disttrain.runtime.progress_link import Identity, Refused

MAX_BODY = 16 * 1024
MAX_TOKEN = 8 * 1024  # a projected token is ~1 KB
POD_NAME, POD_UID = "authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/pod-uid"
NEEDS_TOKEN = (f"a bearer token for audience {AUDIENCE} is needed: the pod's projected token (its progress "
               "volume's `token`)")


def identity_of(review: Any, until: float, expires: float) -> Identity:
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
    return Identity(username.split(":")[2], str(names[0]), str(uids[0]), until, expires)


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
