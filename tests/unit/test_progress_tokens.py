"""The progress endpoint checks a token's signature itself, against the keys the API server
publishes for its service-account issuer, before it spends a TokenReview on it (issue 43, item 3):
forged tokens cost a signature check, never a review, from whatever address they come."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from test_progress_hardening import _close, _endpoint, _post, forged
from test_progress_server import PODS, Reviewer, token

from disttrain.endpoint import keys as progress_keys
from disttrain.endpoint import listener as progress_listener
from disttrain.endpoint import server as progress_server

ISSUER = "https://kubernetes.default.svc.cluster.local"
CONFIGURATION, JWKS = "/.well-known/openid-configuration", "/openid/v1/jwks"


class Signer:
    """The API server's service-account issuer: RSA keys (the newest signs), and its discovery
    documents as `Reviewer.discovery` serves them."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, rsa.RSAPrivateKey]] = []
        self.rotate()

    def rotate(self) -> None:
        self.keys.append((f"key-{len(self.keys)}", rsa.generate_private_key(public_exponent=65537, key_size=2048)))

    def discovery(self) -> dict[str, Any]:
        jwks = [{**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, "use": "sig",
                 "alg": "RS256"} for kid, key in self.keys]
        return {CONFIGURATION: {"issuer": ISSUER, "jwks_uri": f"https://10.0.0.1:6443{JWKS}"},
                JWKS: {"keys": jwks}}

    def token(self, pod_uid: str, pod: str = "mnist-worker-0", issuer: str = ISSUER, **claims: Any) -> str:
        kid, key = self.keys[-1]
        now = int(time.time())
        return jwt.encode({"iss": issuer, "aud": ["disttrain.dev/progress"], "exp": now + 3600, "iat": now,
                           "nbf": now, "sub": pod_uid, "kubernetes.io": {
                               "namespace": "ml", "pod": {"name": pod, "uid": pod_uid},
                               "serviceaccount": {"name": "default", "uid": "sa-uid"}}, **claims},
                          key, algorithm="RS256", headers={"kid": kid})


def signed_reviewer(signer: Signer) -> Reviewer:
    return Reviewer(signer.discovery())


def test_forged_tokens_from_a_shared_address_leave_a_real_first_report_accepted(monkeypatch: Any) -> None:
    """Behind a NAT, an ingress or host networking, a forger and a reporting pod share one address.
    Two hundred unsigned tokens with our audience from it, then the pod's first report: it got 503
    "too many new tokens to review" (the forger's refusals made the address a suspect and drained its
    budget). Verified locally, a forged token is 401 and costs no review at all. (The address's
    connections a second are a bound of their own, test_progress_listener.py's: lifted here.)"""
    monkeypatch.setattr(progress_listener, "ACCEPT_BURST", 1000.0)
    signer = Signer()

    async def main() -> None:
        reviewer = signed_reviewer(signer)
        _, listener, runner, url = await _endpoint(reviewer, clock=lambda: 1000.0)
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as session:
                answers = await asyncio.gather(*(_post(session, url, forged(i), b"{}") for i in range(200)))
                assert set(answers) == {401}
                assert await _post(session, url, signer.token("uid-w0"), b'{"epoch": 1}') == 202
            assert reviewer.reviews == 1, "only the real token is reviewed"
        finally:
            await _close(listener, runner)
    asyncio.run(main())


def test_a_token_signed_by_another_key_is_refused_without_a_review() -> None:
    signer, impostor = Signer(), Signer()

    async def main() -> None:
        reviewer = signed_reviewer(signer)
        _, listener, runner, url = await _endpoint(reviewer, clock=lambda: 1000.0)
        try:
            async with aiohttp.ClientSession() as session:
                impostor.keys[-1] = (signer.keys[-1][0], impostor.keys[-1][1])  # our kid, its key
                assert await _post(session, url, impostor.token("uid-w0"), b"{}") == 401
                assert await _post(session, url, signer.token("uid-w0", exp=int(time.time()) - 120), b"{}") == 401
                assert await _post(session, url, token("uid-w0"), b"{}") == 401, "unsigned"
            assert reviewer.reviews == 0
        finally:
            await _close(listener, runner)
    asyncio.run(main())


def test_a_new_key_is_read_on_its_first_token_and_unknown_kids_reread_at_most_every_reread() -> None:
    signer = Signer()
    clock = [1000.0]

    async def main() -> None:
        reviewer = signed_reviewer(signer)
        server, listener, runner, url = await _endpoint(reviewer, clock=lambda: clock[0])
        try:
            async with aiohttp.ClientSession() as session:
                assert await _post(session, url, signer.token("uid-w0"), b'{"epoch": 1}') == 202
                clock[0] += progress_keys.REREAD
                signer.rotate()
                reviewer.discovery = signer.discovery()
                assert await _post(session, url, signer.token("uid-w0"), b'{"epoch": 1}') == 202, "read again"
                reads = reviewer.reads
                clock[0] += progress_keys.REREAD
                impostor = Signer()
                answers = []
                for n in range(20):  # kids never published: one read (401), then 503 until REREAD is up
                    impostor.keys[-1] = (f"nobody-{n}", impostor.keys[-1][1])
                    answers.append(await _post(session, url, impostor.token("uid-w0"), b"{}"))
                assert answers == [401] + [503] * 19
                assert reviewer.reads == reads + 1
                clock[0] += progress_keys.REREAD
                assert await _post(session, url, impostor.token("uid-w0"), b"{}") == 401, "not published, read anew"
            assert reviewer.reviews == 2 and server.keys.reads == 4
        finally:
            await _close(listener, runner)
    asyncio.run(main())


def test_without_the_issuers_keys_tokens_are_reviewed_as_before_and_it_is_said_once(caplog: Any) -> None:
    """No RBAC to read discovery, or a cluster that doesn't serve it: 404 or 403."""
    async def main() -> None:
        reviewer = Reviewer()  # serves no discovery
        _, listener, runner, url = await _endpoint(reviewer, clock=lambda: 1000.0)
        try:
            async with aiohttp.ClientSession() as session:
                assert await _post(session, url, token("uid-w0"), b'{"epoch": 1}') == 202
                assert await _post(session, url, forged(1), b"{}") == 401
                assert await _post(session, url, token("uid-w0", expires_in=7200), b'{"epoch": 1}') == 202
            assert reviewer.reviews == 3 and reviewer.reads == 1, "read once, then every RETRY"
        finally:
            await _close(listener, runner)
    asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "issuer's keys" in r.getMessage()]
    assert len(said) == 1 and "reviewed by the API server alone" in said[0]


def test_valid_tokens_of_pods_that_dont_report_leave_another_tenants_first_report_accepted(monkeypatch: Any) -> None:
    """A user mints pod-bound tokens for ten of their own pods, none a job's reporter, and posts new
    ones from each: every review succeeds and the desk answers 403, so no address was ever a suspect
    and they drained the shared review budget; another tenant's reporter then got 503. A reviewed
    token that isn't a reporter's now counts as a refusal of its address."""
    for n in range(10):
        monkeypatch.setitem(PODS, f"uid-n{n}", (("ml", "mnist"), f"mnist-worker-{n + 2}", n + 2))

    async def main() -> None:
        reviewer = Reviewer()
        _, listener, runner, url = await _endpoint(reviewer, clock=lambda: 1000.0)
        try:
            async def from_pod(n: int) -> list[int]:
                connector = aiohttp.TCPConnector(local_addr=(f"127.0.0.{n + 2}", 0), limit=1)
                async with aiohttp.ClientSession(connector=connector) as session:
                    return [await _post(session, url, token(f"uid-n{n}", expires_in=3600 + i), b'{"epoch": 1}')
                            for i in range(12)]
            answers = [a for each in await asyncio.gather(*(from_pod(n) for n in range(10))) for a in each]
            assert set(answers) <= {403, 503} and answers.count(403) == reviewer.reviews
            async with aiohttp.ClientSession() as session:  # from 127.0.0.1
                assert await _post(session, url, token("uid-w0"), b'{"epoch": 1}') == 202
        finally:
            await _close(listener, runner)
    asyncio.run(main())


def test_a_cached_review_is_extended_while_reports_keep_coming() -> None:
    """A reporter's review stood REVIEW_TTL from when it was made; past that, a report needed a new
    review, which a drained budget turns into 503 (a checkpoint's confirmation, inside its 10 s
    window, was lost so). Each report now extends it, to the token's expiry at most."""
    clock = [1000.0]

    async def main() -> None:
        reviewer = Reviewer()
        _, listener, runner, url = await _endpoint(reviewer, clock=lambda: clock[0])
        bearer = token("uid-w0", expires_in=7200)
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(4):
                    assert await _post(session, url, bearer, b'{"epoch": 1}') == 202
                    clock[0] += progress_server.REVIEW_TTL * 0.6
            assert reviewer.reviews == 1
        finally:
            await _close(listener, runner)
    asyncio.run(main())
