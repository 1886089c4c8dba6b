"""/healthz and /readyz (runtime/health.py): answered from the start, a standby alive but not
ready, a leader ready while its event loop beats."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from disttrain.runtime.health import STALE_SECONDS, Health


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_standby_is_alive_not_ready_and_a_leader_is_both_while_its_loop_beats() -> None:
    """Issue 31: a standby served no /healthz (kopf's started only with the leader), so the chart's
    liveness probe restarted standbys every ~70 s, backing off towards five minutes."""
    now = [1000.0]
    health = Health(clock=lambda: now[0])
    port = health.serve(0, "127.0.0.1")
    try:
        assert get(port, "/healthz") == (200, "standing by")
        assert get(port, "/readyz")[0] == 503
        health.lead()
        assert get(port, "/healthz") == (200, "leading") and get(port, "/readyz") == (200, "leading")
        now[0] += STALE_SECONDS + 1
        assert get(port, "/healthz")[0] == 503 and get(port, "/readyz")[0] == 503, "a wedged loop"
        health.beat()
        assert get(port, "/healthz")[0] == 200
    finally:
        health.close()


def test_connections_that_never_finish_a_request_hold_no_thread_for_long(monkeypatch: Any) -> None:
    """The review of issue 31: a probe port anyone can reach, a thread per connection with no
    timeout: 500 half-sent requests held 502 threads for good. Now at most 16 at once, 5 s each,
    and a probe still gets its answer."""
    import socket
    import threading
    import time

    from disttrain.runtime import health as module

    monkeypatch.setattr(module, "REQUEST_SECONDS", 0.5)
    health = Health()
    port = health.serve(0, "127.0.0.1")
    try:
        held = []
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and nothing more
            held.append(sock)
        time.sleep(0.2)
        assert threading.active_count() < 40, threading.active_count()
        time.sleep(1.0)
        assert get(port, "/healthz") == (200, "standing by")
        for sock in held:
            sock.close()
    finally:
        health.close()
