"""The list+watch loop every watch of the operator's runs (watch/reflector.py), and the watch's lines
as Rest reads them off the wire (apiserver/rest.py): what a review of issue 45's job watch found.
The scripted API is test_podwatch.py's."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any

import pytest
from aiohttp import web
from kopf._cogs.structs.references import NamespaceName, match_namespace  # the syntax of -n: kopf's
from test_jobwatch import follow, job
from test_podwatch import ScriptedAPI, line, page, run_watch

from disttrain.apiserver.rest import ApiError, Rest
from disttrain.watch import reflector
from disttrain.watch.reflector import exact_names, watched
from disttrain.watch.workloadwatch import WorkloadWatch

NAMESPACES = ["ml", "ml-team", "ml-test", "prod", "myapp-test", "myapp-pr-123", "myapp-pr-456", "otherapp-pr-123"]
PATTERNS = [["ml-*"], ["ml-*", "!ml-test"], ["ml-*, !ml-test"], ["ml-*", "prod"], ["!ml-*"], ["ml-*,dev"],
            ["myapp-*, !*-pr-*, *pr-123"], ["!*-pr-*, *pr-123"], ["!*-pr-*,*pr-123"], ["*", "!prod"], []]


@pytest.mark.parametrize("patterns", PATTERNS, ids=lambda p: "|".join(p) or "none")
def test_namespace_patterns_as_kopf_reads_them(patterns: list[str]) -> None:
    for namespace in NAMESPACES:
        kopf_keeps = not patterns or any(match_namespace(NamespaceName(namespace), p) for p in patterns)
        assert watched(namespace, patterns) == kopf_keeps, (namespace, patterns)


def test_a_namespace_named_twice_is_watched_once() -> None:
    api = ScriptedAPI([[page([job("mnist")], "10")]], [])
    watch, _, _ = follow(api, namespaces=["ml", "ml"])
    assert list(watch.view) == [("ml", "mnist")] and watch.reflector.scopes == ["ml"]
    assert not exact_names(["ml, prod"]), "a comma is a pattern's, not a name's"


def test_an_unexpected_error_is_logged_and_the_watch_lists_again(caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own defect in a store (here, the gauges raising on one event) ends neither the watch nor
    its jobs' updates: its traceback is logged, and a fresh list follows the back-off."""
    monkeypatch.setattr(reflector, "RETRY_SECONDS", (0.01, 0.01))
    api = ScriptedAPI([[page([job("mnist")], "10")], [page([job("mnist", version="12", phase="Running")], "12")]],
                      [[line("MODIFIED", job("mnist", version="11", phase="Failed"))]])
    broke: list[str] = []

    async def scenario() -> Any:
        from disttrain.watch.jobwatch import JobWatch

        def observe(kind: str | None, body: Any) -> None:
            if kind == "MODIFIED" and not broke:
                broke.append(kind)
                raise KeyError("a defect of ours")
        watch = JobWatch(api, ["ml"], changed=lambda key: None, observed=observe)  # type: ignore[arg-type]
        task = asyncio.create_task(watch.run())
        await asyncio.wait_for(watch.synced.wait(), 1)
        await asyncio.sleep(0.3)
        assert not task.done(), "the watch still runs"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return watch
    with caplog.at_level(logging.ERROR, logger="disttrain.watch.reflector"):
        watch = asyncio.run(scenario())
    assert watch.view[("ml", "mnist")][0]["status"] == {"phase": "Running"}, "listed again"
    assert "unexpected error" in caplog.text and "KeyError" in caplog.text


def workload(name: str, job_name: str, uid: str, version: str = "1", admitted: bool = False) -> dict[str, Any]:
    status = {"admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "worker", "count": 2}]},
              "conditions": [{"type": "Admitted", "status": "True"}]} if admitted else {}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": version,
                         "labels": {"disttrain.dev/job-name": job_name}},
            "spec": {"active": True}, "status": status}


class NotServed(ScriptedAPI):
    """Kueue not installed until `served_after` lists have been refused with 404; discovery says
    the same, unless `discovery_serves` (a spurious 404, as around an API server's restart)."""

    def __init__(self, served_after: int, lists: list[list[dict[str, Any]]], watches: list[list[bytes]] | None = None,
                 discovery_serves: bool = False) -> None:
        super().__init__(lists, watches or [])
        self.refused, self.served_after, self.discovery_serves = 0, served_after, discovery_serves
        self.discovered = 0

    async def request(self, method: str, url_path: str, **kwargs: Any) -> Any:
        if url_path == "/apis/kueue.x-k8s.io/v1beta2":
            self.discovered += 1
            if self.discovery_serves or self.discovered > self.served_after:
                return {"kind": "APIResourceList", "resources": [{"name": "workloads"}, {"name": "workloads/status"}]}
            raise ApiError(404, "Not Found", b'{"kind":"Status","code":404}')
        if self.refused < self.served_after:
            self.refused += 1
            raise ApiError(404, "Not Found", b'{"kind":"Status","code":404}')
        return await super().request(method, url_path, **kwargs)


def watch_workloads(api: ScriptedAPI, seconds: float = 0.3) -> tuple[WorkloadWatch, list[tuple[str, str]], bool]:
    queued: list[tuple[str, str]] = []
    watch = WorkloadWatch(api, ["ml"], changed=queued.append)  # type: ignore[arg-type]
    empty: list[bool] = []
    run_watch(watch, seconds, at_sync=lambda: empty.append(len(watch.view) == 0))
    return watch, queued, empty == [True]


def test_workloads_not_served_count_as_listed_and_are_looked_for_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Kueue (a 404 that discovery confirms), reconciling doesn't wait on Workloads;
    installed later, they are followed."""
    monkeypatch.setattr(reflector, "NOT_SERVED_SECONDS", 0.05)
    api = NotServed(2, [[page([workload("wl-1", "mnist", "w1", admitted=True)], "10")]])
    watch, queued, empty_at_sync = watch_workloads(api)
    assert empty_at_sync and api.refused == 2 and api.discovered == 2
    [held] = watch.view[("ml", "mnist")]
    assert held.name == "wl-1" and held.cluster_queue == "cq" and queued == [("ml", "mnist")]


def test_a_404_that_discovery_denies_is_an_error_and_lists_nothing_as_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spurious 404 for a resource the cluster serves (kubernetes/kubernetes#71218): not "listed
    and empty", which would have every queued job's pods stopped; retried as any failure."""
    monkeypatch.setattr(reflector, "RETRY_SECONDS", (0.05, 0.05))
    api = NotServed(1, [[page([workload("wl-1", "mnist", "w1", admitted=True)], "10")]], discovery_serves=True)
    watch, queued, _ = watch_workloads(api)
    assert api.refused == 1 and [w.name for w in watch.view[("ml", "mnist")]] == ["wl-1"]
    assert queued == [("ml", "mnist")], "listed once, after the retry"


class WatchRefused(ScriptedAPI):
    """Listed, then the watch answers 404 (the API server restarting), and discovery too."""

    async def request(self, method: str, url_path: str, **kwargs: Any) -> Any:
        if url_path.startswith("/apis/kueue.x-k8s.io/v1beta2") and "workloads" not in url_path:
            raise ApiError(404, "Not Found", b"{}")
        return await super().request(method, url_path, **kwargs)

    async def watch_lines(self, url_path: str, params: Any, read_timeout: float) -> Any:
        self.watched_from.append(params["resourceVersion"])
        if params:
            raise ApiError(404, "Not Found", b"{}")
        yield b""  # an async generator, as Rest's


def test_what_a_workload_watch_holds_goes_only_with_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """client-go's reflector never empties its store on an error, and neither does ours: held
    Workloads stay through a 404 (even one discovery confirms: Kueue's CRD being replaced), and a
    running queued job keeps its pods."""
    monkeypatch.setattr(reflector, "NOT_SERVED_SECONDS", 0.05)
    api = WatchRefused([[page([workload("wl-1", "mnist", "w1", admitted=True)], "10")]], [])
    watch, queued, _ = watch_workloads(api, seconds=0.3)
    assert [w.name for w in watch.view[("ml", "mnist")]] == ["wl-1"] and queued == [("ml", "mnist")]
    assert api.watched_from == ["10"]


def test_workload_events_follow_their_jobs_label() -> None:
    api = ScriptedAPI([[page([workload("wl-1", "mnist", "w1")], "10")]], [[
        line("MODIFIED", workload("wl-1", "mnist", "w1", version="11", admitted=True)),
        line("ADDED", workload("wl-2", "other", "w2", version="12")),
        line("MODIFIED", workload("wl-2", "mnist", "w2", version="13")),  # relabelled: moves to mnist
        line("DELETED", workload("wl-1", "mnist", "w1", version="14")),
    ]])
    watch, queued, _ = watch_workloads(api, seconds=0.2)
    assert [w.name for w in watch.view[("ml", "mnist")]] == ["wl-2"] and ("ml", "other") not in watch.view
    assert queued == [("ml", "mnist"), ("ml", "mnist"), ("ml", "other"), ("ml", "other"), ("ml", "mnist"),
                      ("ml", "mnist")]


class Plain:
    """An API server over plain HTTP, for Rest's reading of a watch."""

    def __init__(self, port: int) -> None:
        self.server = f"http://127.0.0.1:{port}"

    def as_ssl_context(self) -> ssl.SSLContext | None:
        return None

    def as_http_headers(self) -> dict[str, str]:
        return {}


def test_watch_lines_split_wherever_the_chunks_break() -> None:
    """One event of 1.5 MB (a job near etcd's limit) sent in small writes, with short events around
    it and a line break split across writes: each line comes out whole, once, in order."""
    big = json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "x"}, "pad": "y" * 1_500_000}}).encode()
    events = [b'{"type":"ADDED","object":{}}', big, b'{"type":"DELETED","object":{}}', b'{"type":"BOOKMARK"}']
    wire = b"\n".join(events) + b"\n\n"

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for at in range(0, len(wire), 7919):  # a prime: breaks fall everywhere, a newline's among them
            await response.write(wire[at:at + 7919])
        await response.write_eof()
        return response

    async def scenario() -> list[bytes]:
        app = web.Application()
        app.router.add_get("/api/v1/pods", watch)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        rest = Rest(lambda: Plain(port))
        try:
            return [line async for line in rest.watch_lines("/api/v1/pods", {}, read_timeout=10)]
        finally:
            await rest.close()
            await runner.cleanup()
    assert asyncio.run(scenario()) == events
