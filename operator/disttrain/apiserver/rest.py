"""The operator's API client: JSON over one aiohttp session, for the few dozen kinds of request
it makes (kube.py, leader.py, preflight.py, podwatch.py).

Why not a generated client: kubernetes_asyncio's `client` package imports a model class for every
type in the API, 63 MB and 850 modules, to send plain dicts we build ourselves and read back
as dicts (`make bench`, issue 25: idle RSS 108 MB with it, under 60 without; see the note).
Credentials come from kopf's own login (credentials.py); an answer of 401 logs in again once,
so a rotated service-account token is read anew.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol, TypeVar

import aiohttp
import msgspec

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
REQUEST_TIMEOUT = 60.0  # seconds for one request, as kopf's settings.networking.request_timeout
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "NETRC")


class Endpoint(Protocol):
    """Where and as whom (kopf.ConnectionInfo is one)."""

    @property
    def server(self) -> str: ...

    def as_ssl_context(self) -> Any: ...
    def as_http_headers(self) -> dict[str, str]: ...


class ApiError(Exception):
    """An answer of 300 or more: its code, the HTTP reason, the body (a Status, mostly) and headers."""

    def __init__(self, status: int, reason: str, body: bytes | str = b"", headers: Mapping[str, str] | None = None):
        self.status, self.reason, self.body, self.headers = status, reason, body, dict(headers or {})
        super().__init__(f"({status}) {reason}: {self.message}")

    @property
    def message(self) -> str:
        try:
            return str(json.loads(self.body).get("message") or "")
        except (ValueError, AttributeError):
            text = self.body.decode("utf-8", "replace") if isinstance(self.body, bytes) else self.body
            return text[:200]


def path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
         subresource: str | None = None) -> str:
    """/api/v1/namespaces/ns/pods/name, /apis/group/version/plural/name/status, ..."""
    parts = ["api" if "/" not in api_version else "apis", api_version]
    if namespace is not None:
        parts += ["namespaces", namespace]
    parts.append(plural)
    parts += [p for p in (name, subresource) if p]
    return "/" + "/".join(parts)


def _uses_proxy_env() -> bool:
    """aiohttp with trust_env looks for proxy variables and reads ~/.netrc on every request, in a
    thread (3% of the operator's CPU in a burst, profiled): only where a proxy variable is set."""
    return any(os.environ.get(v) or os.environ.get(v.lower()) for v in PROXY_ENV)


Page = TypeVar("Page")


async def list_pages(rest: Rest, url_path: str, params: Mapping[str, str], decode: Callable[[bytes], Page],
                     more: Callable[[Page], str], accept: str = JSON) -> AsyncIterator[Page]:
    """A paged list's pages, each decoded by `decode`, following the `continue` token `more` reads
    off each (the pages are one snapshot: a continue token lists at the first page's
    resourceVersion). The pod watch's list and the resync's both page through this."""
    asked = dict(params)
    while True:
        page = decode(await rest.request("GET", url_path, params=asked, accept=accept, raw=True))
        yield page
        token = more(page)
        if not token:
            return
        asked["continue"] = token


class Rest:
    def __init__(self, login: Callable[[], Endpoint], max_connections: int = 64) -> None:
        self._login, self._max_connections = login, max_connections
        self._endpoint: Endpoint | None = None
        self._session: aiohttp.ClientSession | None = None

    def _open(self, fresh: bool = False) -> tuple[aiohttp.ClientSession, Endpoint]:
        if self._endpoint is None or fresh:
            self._endpoint = self._login()
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=self._endpoint.as_ssl_context())
            self._session = aiohttp.ClientSession(connector=connector, trust_env=_uses_proxy_env(),
                                                  timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))
        return self._session, self._endpoint

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Rest:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def request(self, method: str, url_path: str, *, params: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str = JSON, accept: str = JSON, raw: bool = False) -> Any:
        """The decoded JSON answer (with `raw`, its bytes undecoded); ApiError for one of 300 or more."""
        # msgspec, not json: the bodies and answers are the operator's busiest encoding and decoding
        # (a pod create's ~3 KB each way), and json.dumps alone was 4% of its CPU holding 10,000 pods.
        data = None if body is None else msgspec.json.encode(body)
        for attempt in (1, 2):
            session, endpoint = self._open(fresh=attempt == 2)
            headers = {**endpoint.as_http_headers(), "Accept": accept, "Content-Type": content_type}
            async with session.request(method, endpoint.server + url_path, params=params, data=data,
                                       headers=headers) as resp:
                answer = await resp.read()
                if resp.status == 401 and attempt == 1:
                    continue  # a token rotated under us: log in again, once
                if resp.status >= 300:
                    raise ApiError(resp.status, resp.reason or "", answer, resp.headers)
                return answer if raw else msgspec.json.decode(answer) if answer else None
        raise AssertionError("unreachable")

    async def watch_lines(self, url_path: str, params: Mapping[str, str], read_timeout: float) -> AsyncIterator[bytes]:
        """The raw lines of a watch (one event each), until the server ends it."""
        session, endpoint = self._open()
        headers = {**endpoint.as_http_headers(), "Accept": JSON}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=read_timeout)
        async with session.get(endpoint.server + url_path, params={**params, "watch": "true"}, headers=headers,
                               timeout=timeout) as resp:
            if resp.status >= 300:
                if resp.status == 401:
                    self._open(fresh=True)
                raise ApiError(resp.status, resp.reason or "", await resp.read(), resp.headers)
            # Split here, not with the stream's readline: that refuses a line over 128 KiB, and one
            # pod's event can be longer (a large spec, many managed fields).
            # Each chunk's bytes are searched once: joining and splitting all that is pending on each
            # chunk cost a 1.5 MB event (a job near etcd's limit) 130 ms of the loop in 16 KiB chunks.
            pending = bytearray()
            async for chunk in resp.content.iter_any():
                searched = len(pending)
                pending += chunk
                begin = 0
                while (end := pending.find(b"\n", searched)) >= 0:
                    line = bytes(pending[begin:end])
                    if line.strip():
                        yield line
                    begin = searched = end + 1
                del pending[:begin]
