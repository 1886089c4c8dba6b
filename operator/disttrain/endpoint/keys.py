"""A token's signature, audience and expiry, checked in the endpoint's process against the keys the
API server publishes for its service-account issuer, before any TokenReview (issue 43, item 3).

A service-account token is a JWT the API server signs; it publishes the public keys at
`/openid/v1/jwks`, which the ClusterRole `system:service-account-issuer-discovery` grants every
service account by default (the chart grants `get` on it too, for a cluster that unbound that). A
signature check costs 0.13 ms (RS256, on a loaded 2-core machine), so a forged token costs no
review and no budget, from whatever address it comes: behind a NAT a forger and a reporting pod
share one, and per-address budgets alone let the forger's refusals starve the pod's first report.
What only the API server knows (the bound pod still exists, the token isn't revoked) is still its
TokenReview's to say.

Keys rotate: a token signed with a `kid` not in hand makes the keys be read again, at most once in
REREAD seconds (an unknown `kid` is free to forge); until then such a token is answered 503, never
refused for good. Where the keys can't be read (the RBAC missing, an older cluster) the endpoint
says so once in its log and reviews tokens as before (`check` is None), asking again every RETRY.

The issuer is not a gate here: the signature proves the cluster's key signed the token, and an
API server given several `--service-account-issuer`s (a migration) accepts tokens of each while
discovery names the first. Its TokenReview decides those.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import jwt

from disttrain.api.progress import AUDIENCE

log = logging.getLogger(__name__)
JWKS = "/openid/v1/jwks"  # the API server serves it whatever jwks_uri its discovery document names
REREAD = 10.0  # seconds between reads of the keys for an unknown kid, at least
RETRY = 300.0  # seconds before keys that couldn't be read are asked for again
READ_TIMEOUT = 5.0
LEEWAY = 60.0  # seconds of clock skew allowed on exp and nbf, as the API server's own validator allows
KEY_TYPES = frozenset({"RSA", "EC"})  # the API server signs with either; a symmetric key is never ours
MAX_KEYS = 16


class TokenRefused(Exception):
    """The token is no good (signature, audience, expiry, binding): `retry_after` None. With
    `retry_after`, its key is not known yet: ask again then."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message, self.retry_after = message, retry_after


class IssuerKeys:
    def __init__(self, read: Callable[[str], Awaitable[Any]], clock: Callable[[], float] = time.monotonic) -> None:
        self.read, self.clock = read, clock
        self.keys: dict[str, jwt.PyJWK] = {}
        self.available: bool | None = None  # None until first read
        self.read_at = -math.inf
        self.reads = 0
        self._lock = asyncio.Lock()

    async def check(self, token: str) -> float | None:
        """The token's expiry (epoch seconds) when its signature, audience, expiry and pod binding
        hold; None when the keys can't be read (the caller reviews it as before); else TokenRefused."""
        if self.available is None or (self.available is False and not self._lock.locked()):
            await self._refresh(None)  # the first read is waited for; while unreadable, one read every RETRY
        if not self.available:
            return None
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except (jwt.InvalidTokenError, ValueError, RecursionError) as err:
            raise TokenRefused("not a signed token") from err
        if not isinstance(kid, str | None):
            raise TokenRefused("not a signed token")
        # A re-read under way is not waited for (a forger's kids would queue on it); one just done
        # without the kid says it is not published.
        if (kid is not None and kid not in self.keys and not self._lock.locked() and await self._refresh(kid)
                and kid not in self.keys):
            raise TokenRefused("signed by a key the API server doesn't publish")
        # The API server always names the kid; a token without one is tried against each key.
        keys = list(self.keys.values()) if kid is None else [self.keys[kid]] if kid in self.keys else []
        if not keys:
            raise TokenRefused("signed by a key not known yet: try again shortly",
                               max(1.0, self.read_at + REREAD - self.clock()))
        return self._verify(token, keys)

    def _verify(self, token: str, keys: list[jwt.PyJWK]) -> float:
        error: Exception | None = None
        for key in keys:
            try:
                claims = jwt.decode(token, key, algorithms=[key.algorithm_name], audience=AUDIENCE, leeway=LEEWAY,
                                    options={"require": ["exp", "aud"], "verify_iss": False})
            except (jwt.InvalidTokenError, ValueError, RecursionError, OverflowError) as err:
                error = err
                continue
            binding = claims.get("kubernetes.io")
            pod = binding.get("pod") if isinstance(binding, dict) else None
            if not (isinstance(pod, dict) and isinstance(pod.get("uid"), str)):
                raise TokenRefused("the token is not bound to a pod: use the pod's projected token")
            return float(claims["exp"])
        raise TokenRefused(f"token refused: {type(error).__name__}")

    async def _refresh(self, kid: str | None) -> bool:
        """Read the keys, if due: the first time, for an unknown kid at most every REREAD, and every
        RETRY while they couldn't be read. One read at a time; those waiting take its keys. True
        when this call read them."""
        async with self._lock:
            due = RETRY if self.available is False else REREAD
            if (self.available and (kid is None or kid in self.keys)) or self.clock() - self.read_at < due:
                return False
            self.read_at = self.clock()
            self.reads += 1
            try:
                keys = await asyncio.wait_for(self._read(), READ_TIMEOUT)
            except Exception as err:  # ApiError (403: no RBAC; 404: an older cluster), a timeout, a bad document
                if self.available is None:
                    log.warning("progress endpoint: can't read the service-account issuer's keys (%s: %s): "
                                "tokens are reviewed by the API server alone", type(err).__name__, err)
                    self.available = False
                return False
            if not self.available:
                log.info("progress endpoint: checking tokens against the issuer's %d keys", len(keys))
            self.keys, self.available = keys, True
            return True

    async def _read(self) -> dict[str, jwt.PyJWK]:
        document = await self.read(JWKS)
        keys = {}
        for entry in (document.get("keys") or [])[:MAX_KEYS]:
            if isinstance(entry, dict) and entry.get("kty") in KEY_TYPES and isinstance(entry.get("kid"), str):
                try:
                    keys[entry["kid"]] = jwt.PyJWK(entry)
                except jwt.PyJWTError as err:
                    log.info("progress endpoint: a published key left out: %s", err)
        if not keys:
            raise ValueError("the JWKS holds no RSA or EC key with a kid")
        return keys
