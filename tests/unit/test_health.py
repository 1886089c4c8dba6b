"""/healthz and /readyz (runtime/health.py): answered from the start, a standby alive but not
ready, a leader ready while its event loop beats."""

from __future__ import annotations

import urllib.error
import urllib.request

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
