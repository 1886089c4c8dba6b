"""A fault-injecting proxy in front of the API server, for what a real API server can't be made to
do on cue: answer 429 or 500 to a share of the deletes, lose the answer to a create it carried
out, expire the watches of a resource (a 410 in the stream, as after an etcd compaction), hold
the list that follows.

It serves TLS with a certificate the cluster's CA signed for 127.0.0.1, so a client needs only a
kubeconfig whose `server` is `proxy.url`; the client's own credentials (the operator's token)
go through unchanged. It runs its own event loop in a thread; the test thread drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

# Hop-by-hop headers and those aiohttp sets itself; Accept-Encoding too, so that no answer comes
# compressed (a watch passes through chunk by chunk).
_DROP = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "keep-alive"}
T = TypeVar("T")
_REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


def route(path: str) -> tuple[str, str]:
    """(resource, subresource) of an API path: /api/v1/namespaces/ns/pods/p -> ("pods", "")."""
    parts = [p for p in path.split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:]  # /api/v1/... or /apis/group/version/...
    if len(parts) >= 3 and parts[0] == "namespaces":
        parts = parts[2:]
    return (parts[0] if parts else "", parts[2] if len(parts) > 2 else "")


@dataclass
class Fault:
    """Answer `code` to a share (`rate`) of the `method` requests on `resource`; `after_forwarding`:
    the request is carried out first and its answer lost (a timeout after the write)."""

    method: str
    resource: str
    code: int
    rate: float = 1.0
    after_forwarding: bool = False
    subresource: str = ""
    seed: int = 0
    answered: int = 0
    _random: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def hits(self, method: str, resource: str, subresource: str) -> bool:
        return ((method, resource, subresource) == (self.method, self.resource, self.subresource)
                and self._random.random() < self.rate)

    def answer(self) -> web.Response:
        self.answered += 1
        reason = _REASONS.get(self.code, "InternalError")
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": self.code,
                  "reason": reason, "message": f"injected by the chaos proxy: {reason}"}
        headers = {"Retry-After": "1"} if self.code == 429 else {}
        return web.json_response(status, status=self.code, headers=headers)


def _expired_event() -> bytes:
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410,
              "reason": "Expired", "message": "too old resource version (injected by the chaos proxy)"}
    return json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"


class FaultProxy:
    def __init__(self, upstream: str, ca: Path, cert: Path, key: Path) -> None:
        self.upstream, self.ca, self.cert, self.key = upstream.rstrip("/"), ca, cert, key
        self.faults: list[Fault] = []
        self.requests: Counter[tuple[str, str, str]] = Counter()  # (method, resource, subresource) forwarded
        self.expired: Counter[str] = Counter()  # resource -> watches ended with a 410
        self._watches: dict[str, set[asyncio.Event]] = {}
        self._holds: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.url = ""

    # -- what the test thread calls ----------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the chaos proxy did not start")
        return self

    def stop(self) -> None:
        assert self._loop is not None and self._stopping is not None
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=30)

    def inject(self, fault: Fault) -> Fault:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.faults.append, fault)
        return fault

    def expire_watches(self, resource: str) -> int:
        """End every open watch of `resource` with a 410 ERROR event: its clients must list again."""
        async def expire() -> int:
            events = self._watches.get(resource, set())
            for event in events:
                event.set()
            return len(events)
        return self._call(expire())

    @contextlib.contextmanager
    def lists_held(self, resource: str) -> Iterator[None]:
        """Lists of `resource` (and new watches with no version to resume from) wait for the block."""
        async def hold() -> None:
            self._holds[resource] = asyncio.Event()

        async def release() -> None:
            self._holds.pop(resource).set()
        self._call(hold())
        try:
            yield
        finally:
            self._call(release())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    # -- the proxy's own loop ----------------------------------------------------------------

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        await self._start()
        self._ready.set()
        await self._stopping.wait()
        await self._shutdown()
        # TLS connections close over a few more turns of the loop (aiohttp's graceful shutdown).
        await asyncio.sleep(0.25)

    async def _start(self) -> None:
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(self.cert, self.key)
        upstream_ssl = ssl.create_default_context(cafile=str(self.ca))
        # No read timeout: a watch stays open for minutes.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=upstream_ssl, limit=0),
                                              timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=server_ssl)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"https://127.0.0.1:{port}"

    async def _shutdown(self) -> None:
        for events in self._watches.values():
            for event in events:
                event.set()
        await self._runner.cleanup()
        await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        resource, subresource = route(request.path)
        watching = request.query.get("watch") in ("true", "1")
        hold = self._holds.get(resource)
        if hold is not None and request.method == "GET" and (not watching or "resourceVersion" not in request.query):
            await hold.wait()
        fault = next((f for f in self.faults if f.hits(request.method, resource, subresource)), None)
        if fault is not None and not fault.after_forwarding:
            return fault.answer()
        self.requests[(request.method, resource, subresource)] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        body = await request.read()
        async with self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                         data=body or None) as upstream:
            if fault is not None:
                await upstream.read()
                return fault.answer()
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP}
            if not watching:
                return web.Response(body=await upstream.read(), status=upstream.status, headers=out_headers)
            return await self._stream(request, upstream, out_headers, resource)

    async def _stream(self, request: web.Request, upstream: aiohttp.ClientResponse, headers: dict[str, str],
                      resource: str) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, headers=headers)
        response.enable_chunked_encoding()
        await response.prepare(request)
        expire = asyncio.Event()
        self._watches.setdefault(resource, set()).add(expire)
        expired = asyncio.ensure_future(expire.wait())
        pending = b""
        try:
            while True:
                chunk = asyncio.ensure_future(upstream.content.readany())
                await asyncio.wait({chunk, expired}, return_when=asyncio.FIRST_COMPLETED)
                if expire.is_set():
                    chunk.cancel()
                    self.expired[resource] += 1
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await response.write(_expired_event())
                    break
                data = chunk.result()
                if not data:
                    break
                # Whole lines only (one event each), so that an injected event never splits one.
                pending += data
                whole, _, pending = pending.rpartition(b"\n")
                if whole:
                    await response.write(whole + b"\n")
        except (ConnectionError, aiohttp.ClientError):
            pass  # the client or the API server went away: so does this stream
        finally:
            expired.cancel()
            self._watches[resource].discard(expire)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
        return response
