"""`/healthz` and `/readyz` on `--health-port`, from the moment the process starts.

kopf's own liveness endpoint starts with kopf, which starts once this replica leads: a standby
answered nothing, and the chart's liveness probe restarted every standby about every 70 s, each
restart backing off towards five minutes, so failover waited on a standby's back-off (issue 31).
This server answers from a thread before leader election:

- `/healthz` (liveness): 200 while standing by; while leading, 200 as long as the event loop beats
  (`beat`, every few seconds from a task on it) and 503 once it hasn't for STALE_SECONDS, so a
  wedged loop is restarted;
- `/readyz` (readiness): 200 only while leading with a beating loop: the progress Service sends
  the pods' reports to the leader alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STALE_SECONDS = 60.0
BEAT_SECONDS = 5.0
MAX_CONNECTIONS, REQUEST_SECONDS = 16, 5.0  # a probe is one short GET; anyone can connect to the port


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS at once (past them, closed at once), each
    given REQUEST_SECONDS: connections that send half a request can't pile up threads or file
    descriptors in the operator's process (issue 31's review)."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog (socketserver's default is 5)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class Health:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.leading = False
        self.beaten = clock()
        self._server: ThreadingHTTPServer | None = None

    def lead(self) -> None:
        self.leading, self.beaten = True, self.clock()

    def beat(self) -> None:
        self.beaten = self.clock()

    def answer(self, path: str) -> tuple[int, str]:
        fresh = self.clock() - self.beaten < STALE_SECONDS
        if path == "/healthz":
            if not self.leading:
                return 200, "standing by"
            return (200, "leading") if fresh else (503, f"the event loop has not run for {STALE_SECONDS:.0f}s")
        if path == "/readyz":
            if not self.leading:
                return 503, "standing by: another replica leads"
            return (200, "leading") if fresh else (503, f"the event loop has not run for {STALE_SECONDS:.0f}s")
        return 404, "not found: /healthz or /readyz"

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Listening from a daemon thread; the port (0: one the system chose)."""
        health = self

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_SECONDS  # a connection that sends nothing holds its thread this long at most

            def do_GET(self) -> None:  # http.server's name
                status, text = health.answer(self.path.split("?")[0])
                body = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:  # a line per probe is not a log
                return None

        self._server = BoundedServer((host, port), Handler)
        threading.Thread(target=self._server.serve_forever, name="health", daemon=True).start()
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
