"""The progress endpoint's own process (`python -m disttrain.endpoint --link-fd N
--listen-fd M`, whose __main__ runs `main` here), started and restarted by the controller
(progress_supervisor.py), never by hand: it accepts on the socket the controller bound (and keeps,
so a restart never loses the port).

Everything a pod sends lands here and nowhere else: TLS, HTTP, tokens, bodies, floods. The process
has its own memory bound (RLIMIT_DATA, `--memory-mib`: past it an allocation fails here, and the
controller's memory is untouched) and asks the kernel to pick it first should its container run
out of memory anyway (oom_score_adj 1000). It talks to the controller only through the link
(runtime/progress_link.py), and exits when the link closes: a controller that is gone leaves no endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import resource
import socket
import ssl
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from disttrain.apiserver import credentials
from disttrain.apiserver.kube import Kube
from disttrain.apiserver.rest import Rest
from disttrain.endpoint.checks import MAX_TOKEN
from disttrain.endpoint.listener import KEEPALIVE, Listener
from disttrain.endpoint.server import ProgressServer
from disttrain.runtime.progress_link import MAX_LINE, EndpointSide
from disttrain.runtime.serving_cert import ServingCert

log = logging.getLogger("disttrain.progress")
STATS_EVERY = 1.0  # seconds between the counts sent to the controller (its /metrics shows them)
NICENESS = 10
QUIET_SECONDS = 10.0  # one log line per kind of loop error in this long: a flood is not a log flood


class ApiServer(Kube):
    """The endpoint's API server: TokenReview, and a GET of the issuer's keys (endpoint/keys.py)
    through the same client and credentials."""

    async def read(self, url_path: str) -> Any:
        # The API server serves the keys as application/jwk-set+json, and answers 406 to a request
        # that accepts only application/json (the local plane's audit log, v1.37.2).
        return await self.rest.request("GET", url_path, accept="application/jwk-set+json, application/json")


def bound_memory(mib: int) -> None:
    """RLIMIT_DATA counts the process's writable private mappings, not only what is resident: each
    thread's stack (asyncio's resolver threads) and each malloc arena count whole. A forged-token
    storm hit 256 MiB with about 180 MB resident (make chaos): stacks are made small and arenas few
    here, and the default bound is 384."""
    threading.stack_size(512 * 1024)
    if mib > 0:
        limit = mib * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
    except OSError:
        pass  # not Linux, or not allowed: the memory bound still holds


def lower_priority() -> None:
    """The endpoint shares its container's CPU limit with the controller, and within one cgroup the
    kernel shares CPU by weight: at nice 10 the endpoint weighs about a tenth of the controller (110
    against 1024), so TLS handshakes at any rate leave reconciling nearly all the CPU it asks for,
    and the endpoint still uses what the controller leaves idle. Unniced, 1,700 handshakes a second
    (0.6 ms each) throttled reconciling (issue 43). Raising one's own nice needs no privilege."""
    with contextlib.suppress(OSError):
        os.nice(NICENESS)


def ssl_context(cert: Mapping[str, str]) -> ssl.SSLContext:
    return ServingCert(cert["ca"].encode(), cert["cert"].encode(), cert["key"].encode()).ssl_context()


def quiet_exception_handler() -> Any:
    said: dict[str, float] = {}

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        kind = str(context.get("message"))[:80]
        if time.monotonic() - said.get(kind, -QUIET_SECONDS) >= QUIET_SECONDS:
            said[kind] = time.monotonic()
            log.warning("progress endpoint: %s: %s", kind, context.get("exception"))
    return handle


async def serve(link_fd: int, listen_fd: int) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(quiet_exception_handler())
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=link_fd), limit=MAX_LINE)
    link = EndpointSide(reader, writer)
    first: asyncio.Future[Mapping[str, str]] = loop.create_future()
    listener: Listener | None = None

    def on_cert(cert: Mapping[str, str]) -> None:
        if not first.done():
            first.set_result(cert)
        elif listener is not None:
            listener.ssl_context = ssl_context(cert)  # new connections; open ones keep theirs
            log.info("progress endpoint: serving a renewed certificate")

    reading = asyncio.create_task(link.run(on_cert))
    either: list[asyncio.Future[Any]] = [reading, first]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not first.done():
        return  # the controller went before it sent a certificate
    server = ProgressServer(ApiServer(Rest(credentials.login)), link)
    runner = web.AppRunner(server.app(), access_log=None, keepalive_timeout=KEEPALIVE, max_headers=32,
                           max_field_size=MAX_TOKEN + 64, max_line_size=1024, handler_cancellation=True)
    await runner.setup()
    listener = Listener(runner.server, ssl_context(first.result()))  # type: ignore[arg-type]
    server.answered = lambda request: listener.answered(request.transport)
    bound = await listener.start(socket.socket(fileno=listen_fd))
    log.info("progress endpoint serving on port %d", bound)
    stats = asyncio.create_task(send_stats(link, server, listener), name="stats")
    try:
        # Until the controller closes the link; or, should the listener's or the stats' task end (it
        # must not), out: the controller starts a whole new endpoint rather than keep one that serves
        # nobody.
        done, _ = await asyncio.wait([reading, stats, *listener.tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {reading}:
            error = None if task.cancelled() else task.exception()
            log.error("progress endpoint: its %s task ended (%s): starting afresh", task.get_name(),
                      f"{type(error).__name__}: {error}" if error else "no error")
    finally:
        stats.cancel()
        await listener.stop()
        await runner.cleanup()


async def send_stats(link: EndpointSide, server: ProgressServer, listener: Listener) -> None:
    """Each second something changed: the answers by result, the connections open, and those closed
    since (refused past the bounds, or past their deadline)."""
    told = {"open": 0, "refused": 0, "expired": 0, "evicted": 0}
    while True:
        await asyncio.sleep(STATS_EVERY)
        now = {"open": len(listener.open), "refused": listener.refused, "expired": listener.expired,
               "evicted": listener.evicted}
        counts = server.take_counts()
        if counts or now != told:
            await link.tell({"counts": counts, "connections": {
                "open": now["open"], **{k: now[k] - told[k] for k in ("refused", "expired", "evicted")}}})
            told = now


def small_tls_buffers() -> None:
    """asyncio gives each TLS connection a read buffer of 256 KiB (SSLProtocol.max_size), allocated
    and zeroed when the connection is accepted: 2,000 bare TCP connections held 336 MB resident here
    (make chaos). A report is at most 16 KiB; 32 KiB a connection is plenty, and a flood costs an
    eighth as much."""
    import asyncio.sslproto

    asyncio.sslproto.SSLProtocol.max_size = 32 * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="disttrain.endpoint")
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--memory-mib", type=int, default=384)
    args = parser.parse_args(argv)
    # force: forked (endpoint/prefork.py), it has the controller's handlers and level (DEBUG with
    # --verbose: a line per refused request); exec'd, none.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    bound_memory(args.memory_mib)
    lower_priority()
    small_tls_buffers()
    asyncio.run(serve(args.link_fd, args.listen_fd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
