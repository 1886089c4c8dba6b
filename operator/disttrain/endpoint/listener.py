"""The progress endpoint's socket, with bounds that aiohttp's own server doesn't have.

aiohttp's TCPSite accepts every connection, gives a TLS handshake asyncio's default of 60 s, and a
request's line and headers no deadline at all, with keep-alive for an hour; Python's TLS layer
holds a 256 KiB buffer per connection from its first byte. 3,000 connections that sent half a
request line and waited grew the operator from 51 to 897 MB (issue 31). So this listener accepts
itself, and:

- refuses at once (closes) a connection past ACCEPTS_PER_SECOND (ACCEPT_BURST at once) from one
  address, before its TLS handshake: a handshake costs ~0.6 ms of CPU, and 1,700 a second from a few
  pods throttled reconciling, which shares the container's CPU limit (issue 43);
- refuses at once a connection past MAX_PER_SOURCE from one address; past MAX_CONNECTIONS
  in all, the oldest connection of the address holding the most goes to make room for an address
  holding fewer (else the newcomer is refused): the worst a flood holds is MAX_CONNECTIONS buffers
  (64 MiB at 256), and a few addresses can't keep the rest out;
- gives the TLS handshake HANDSHAKE_TIMEOUT;
- aborts a connection that hasn't been answered REQUEST_DEADLINE after it was made or after its
  last answer: a request's line, headers and body, and an idle keep-alive, all within that; aiohttp's
  own keep-alive is KEEPALIVE (the reporter opens a connection per report, every 2 s at most).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from disttrain.endpoint.limits import Bucket, Lru

log = logging.getLogger(__name__)
MAX_CONNECTIONS, MAX_PER_SOURCE = 256, 32
# A reporter opens a connection per report, a report every 0.5 s at most a token; an address behind
# a NAT or an ingress (a MultiKueue worker cluster) carries several reporters.
ACCEPTS_PER_SECOND, ACCEPT_BURST = 20.0, 40.0
MAX_SOURCES = 10_000  # addresses whose accept rate is remembered; the least recently seen go first
HANDSHAKE_TIMEOUT = 5.0
REQUEST_DEADLINE = 10.0
KEEPALIVE = 1.0
SWEEP_EVERY = 0.5


class Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the time it was last answered."""

    def __init__(self, listener: Listener, source: str, inner: asyncio.Protocol) -> None:
        self.listener, self.source, self.inner = listener, source, inner
        self.since = listener.clock()
        self.transport: asyncio.BaseTransport | None = None
        self.serving: asyncio.Task[None] | None = None  # until the handshake is done: what to cancel to end it
        self.released = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.listener.by_transport[id(transport)] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.release(self)
        self.inner.connection_lost(exc)


class Listener:
    def __init__(self, protocol: Callable[[], asyncio.Protocol], ssl_context: ssl.SSLContext | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.protocol, self.ssl_context, self.clock = protocol, ssl_context, clock
        self.open: set[Tracked] = set()
        self.per_source: Counter[str] = Counter()
        self.by_transport: dict[int, Tracked] = {}
        self.accepts = Lru(MAX_SOURCES)  # accept-rate buckets by address
        # Connections closed at once, past their deadline, and to make room for another address's.
        self.refused = self.expired = self.evicted = 0
        self._sock: socket.socket | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self._serving: set[asyncio.Task[None]] = set()

    async def start(self, sock: socket.socket) -> int:
        """Accepting on `sock` (listening already: bind() below, in the controller's process, which
        keeps the port across the endpoint's restarts); its port."""
        self._sock = sock
        self._sock.setblocking(False)
        self.tasks = [asyncio.create_task(self._accept(), name="progress accept"),
                       asyncio.create_task(self._sweep(), name="progress deadlines")]
        return int(self._sock.getsockname()[1])

    async def stop(self) -> None:
        for task in [*self.tasks, *self._serving]:
            task.cancel()
        await asyncio.gather(*self.tasks, *self._serving, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
        for tracked in list(self.open):
            if tracked.transport is not None:
                tracked.transport.abort()  # type: ignore[attr-defined]

    def answered(self, transport: Any) -> None:
        tracked = self.by_transport.get(id(transport))
        if tracked is not None:
            tracked.since = self.clock()

    def release(self, tracked: Tracked) -> None:
        if tracked.released:
            return
        tracked.released = True
        self.open.discard(tracked)
        self.per_source[tracked.source] -= 1
        if self.per_source[tracked.source] <= 0:
            del self.per_source[tracked.source]
        if tracked.transport is not None:
            self.by_transport.pop(id(tracked.transport), None)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, address = await loop.sock_accept(self._sock)
            except Exception as err:  # EMFILE, MemoryError past the process's bound: wait, don't spin or die
                log.warning("progress endpoint: accept failed: %s: %s", type(err).__name__, err)
                await asyncio.sleep(0.1)
                continue
            source = str(address[0])
            if self._too_fast(source) or self.per_source[source] >= MAX_PER_SOURCE or (
                    len(self.open) >= MAX_CONNECTIONS and not self._make_room(source)):
                self.refused += 1
                conn.close()
                continue
            tracked = Tracked(self, source, self.protocol())
            self.open.add(tracked)
            self.per_source[source] += 1
            serving = tracked.serving = loop.create_task(self._serve(conn, tracked))
            self._serving.add(serving)  # held: the loop keeps only a weak reference to a task
            serving.add_done_callback(self._serving.discard)

    def _too_fast(self, source: str) -> bool:
        now = self.clock()
        bucket = self.accepts.get(source) or Bucket(ACCEPTS_PER_SECOND, ACCEPT_BURST, now)
        self.accepts.put(source, bucket)
        return bucket.take(now) > 0

    def _make_room(self, source: str) -> bool:
        """All connections are held: the oldest of the address holding the most goes, if it holds
        more than `source` does, so a few addresses can't keep every other pod out."""
        most, held = max(self.per_source.items(), key=lambda item: item[1], default=("", 0))
        if held <= self.per_source[source] + 1:
            return False
        oldest = min((t for t in self.open if t.source == most), key=lambda t: t.since)
        self.evicted += 1
        self.close(oldest)
        return True

    async def _serve(self, conn: socket.socket, tracked: Tracked) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: tracked, conn, ssl=self.ssl_context,
                                               ssl_handshake_timeout=HANDSHAKE_TIMEOUT if self.ssl_context else None)
        except BaseException:
            self.release(tracked)  # the handshake failed or timed out (or worse): connection_lost never comes
            conn.close()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            late = self.clock() - REQUEST_DEADLINE
            for tracked in [t for t in self.open if t.since < late]:
                self.expired += 1
                self.close(tracked)

    def close(self, tracked: Tracked) -> None:
        if tracked.transport is not None:
            tracked.transport.abort()  # type: ignore[attr-defined]
        elif tracked.serving is not None:
            # Mid-handshake, through the loop: cancelled, connect_accepted_socket closes its transport,
            # which leaves the selector, then _serve closes the socket. Closing the socket here left
            # its fd in the selector under a live transport, and the next connection accepted on that
            # fd hung for the handshake's 5 s, then was reset (issue 43, item 3).
            tracked.serving.cancel()
        self.release(tracked)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (0: a port the system chooses)."""
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=512, reuse_port=False)
