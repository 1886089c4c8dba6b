"""The controller's keeper of the progress endpoint's process (endpoint/process.py).

It starts the process with one end of a socket pair (runtime/progress_link.py), answers its questions
through the desk (control/progress_desk.py), hands it the serving certificate and every renewal of it, and
starts it again when it ends, after a back-off (RESTART_BACKOFF, doubling to its cap; a process
that served for a minute starts the back-off afresh). Whatever happens to the endpoint, this
keeper only waits on it: reconciling never does.

The certificate is checked every CERT_CHECK_SECONDS while running: runtime/serving_cert.py signs a
new one with the same CA when the one in the Secret has under a month left, so an operator that
runs for years never serves an expired certificate (issue 31: it was renewed only at start-up).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from disttrain.endpoint.forked import ChildProcess, Prefork
from disttrain.endpoint.listener import bind
from disttrain.runtime import metrics
from disttrain.runtime.progress_link import MAX_LINE, Desk, LinkError, send, serve_controller_side
from disttrain.runtime.serving_cert import ServingCert

log = logging.getLogger(__name__)
RESTART_BACKOFF = (1.0, 60.0)  # seconds: first, cap
HEALTHY_AFTER = 60.0  # seconds served after which a restart's back-off starts afresh
CERT_CHECK_SECONDS = 6 * 3600.0
STOP_GRACE = 5.0
RESULTS = frozenset({"accepted", "invalid", "unauthenticated", "forbidden", "throttled", "unavailable"})
MAX_COUNT = 1_000_000  # a second's count from the endpoint, at most: it can't inflate the metrics past it


class EndpointProcess:
    def __init__(self, port: int, desk: Desk, certificate: Callable[[], Awaitable[ServingCert]],
                 host: str = "0.0.0.0", memory_mib: int = 384, cert: ServingCert | None = None,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep, prefork: Prefork | None = None) -> None:
        self.port, self.desk, self.certificate, self.host, self.memory_mib = port, desk, certificate, host, memory_mib
        self.cert = cert  # the certificate in hand: the start-up's, then the last checked
        self.sleep = sleep
        self.prefork = prefork  # endpoint/prefork.py: the first endpoint, sharing the controller's modules
        self.process: ChildProcess | None = None
        self.listening: socket.socket | None = None  # bound here, accepted on there
        self.starts = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Bind the port now (a port taken fails the operator's start, as a server's would), and keep
        the endpoint's process running on it."""
        self.listening = bind(self.host, self.port)
        self._task = asyncio.create_task(self.run(), name="progress endpoint")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.listening is not None:
            self.listening.close()
        if self.prefork is not None:
            await self.prefork.close()

    async def run(self) -> None:
        backoff = RESTART_BACKOFF[0]
        while True:
            started = time.monotonic()
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the endpoint's trouble is never the controller's
                log.warning("progress endpoint: %s: %s", type(err).__name__, err)
            backoff = RESTART_BACKOFF[0] if time.monotonic() - started >= HEALTHY_AFTER else backoff
            log.warning("progress endpoint: its process ended (exit %s); starting another in %.0fs",
                        self.process.returncode if self.process else None, backoff)
            await self.sleep(backoff)
            backoff = min(RESTART_BACKOFF[1], backoff * 2)

    async def once(self) -> None:
        """One endpoint process, from its start to its end."""
        assert self.listening is not None
        ours, theirs = socket.socketpair()
        try:
            self.process = None
            self.process = await self._spawn(theirs.fileno(), self.listening.fileno())
        finally:
            theirs.close()
            if self.process is None:
                ours.close()  # it never started: its end of the link goes too
        self.starts += 1
        metrics.PROGRESS_ENDPOINT_STARTS.inc()
        tasks: list[asyncio.Task[Any]] = []
        writer: asyncio.StreamWriter | None = None
        try:  # from here whatever ends this start (a cancel included) ends the process too
            reader, writer = await asyncio.open_connection(sock=ours, limit=MAX_LINE)
            tasks = [asyncio.create_task(self._answer(reader, writer)), asyncio.create_task(self._certify(writer)),
                     asyncio.create_task(self.process.wait())]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()
            if writer is not None:
                writer.close()
            else:
                ours.close()
            await self._end()

    async def _spawn(self, link_fd: int, listen_fd: int) -> ChildProcess:
        """The first, the process forked for it where there is one; any other by exec. A forked
        start that failed (ForkFailed) ends this start, its link with it, and that process: the next,
        after the back-off, is by exec on a link of its own (a late start can't share this one)."""
        if self.prefork is not None and not self.prefork.gone:
            return await self.prefork.start(link_fd, listen_fd, self.memory_mib)
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "disttrain.endpoint", "--link-fd", str(link_fd), "--listen-fd", str(listen_fd),
            "--memory-mib", str(self.memory_mib), pass_fds=(link_fd, listen_fd), stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, "MALLOC_ARENA_MAX": "2"})  # its memory bound counts arenas whole

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve_controller_side(reader, writer, self.desk, on_stats)
        except LinkError as err:
            log.warning("progress endpoint: ended for a line out of protocol: %s", err)

    async def _certify(self, writer: asyncio.StreamWriter) -> None:
        """A new endpoint gets the certificate in hand at once (the start-up's, or the last checked:
        no Secret read and no signing process per start), then it is checked every CERT_CHECK_SECONDS
        and a renewal sent on."""
        sent: bytes | None = None
        while True:
            if self.cert is None or sent is not None:
                try:
                    self.cert = await self.certificate()
                except Exception as err:  # the API server's trouble: the endpoint keeps the one it has
                    log.warning("progress endpoint: the serving certificate could not be checked: %s", err)
            if self.cert is not None and self.cert.cert != sent:
                await send(writer, {"cert": {"ca": self.cert.ca.decode(), "cert": self.cert.cert.decode(),
                                             "key": self.cert.key.decode()}})
                sent = self.cert.cert
            await self.sleep(CERT_CHECK_SECONDS if sent is not None else RESTART_BACKOFF[0])

    async def _end(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE)
        except TimeoutError:
            process.kill()
            await process.wait()


def on_stats(message: Mapping[str, Any]) -> None:
    """The endpoint's counts into the controller's metrics: known results only, each bounded."""
    counts = message.get("counts")
    for result, count in (counts.items() if isinstance(counts, dict) else ()):
        if result in RESULTS and isinstance(count, int) and 0 < count <= MAX_COUNT:
            metrics.PROGRESS_REPORTS.labels(result=result).inc(count)
    connections = message.get("connections")
    if not isinstance(connections, dict):
        return
    if isinstance(now_open := connections.get("open"), int) and 0 <= now_open <= MAX_COUNT:
        metrics.PROGRESS_CONNECTIONS.set(now_open)
    for reason in ("refused", "expired", "evicted"):
        if isinstance(count := connections.get(reason), int) and 0 < count <= MAX_COUNT:
            metrics.PROGRESS_CONNECTIONS_CLOSED.labels(reason=reason).inc(count)
