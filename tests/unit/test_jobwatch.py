"""The job watch (jobwatch.py) against a scripted API (test_podwatch.py's): the jobs held as their
JSON, a job queued only when what is held changed, deletions and a re-list's purge told to the
gauges, namespace globs. The real API server's side of it runs in every integration test."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from test_podwatch import ScriptedAPI, line, page, run_watch

from disttrain.watch import reflector
from disttrain.watch.job_events import HeldJob, decode_event, decode_list
from disttrain.watch.jobwatch import JobWatch

Key = tuple[str, str]


@pytest.fixture(autouse=True)
def rewatch_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch ended is asked for again after WATCH_PAUSE_SECONDS: at once here, for the script's pace."""
    monkeypatch.setattr(reflector, "WATCH_PAUSE_SECONDS", 0.0)


def job(name: str, version: str = "1", namespace: str = "ml", phase: str | None = None,
        uid: str = "uid-1") -> dict[str, Any]:
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": version,
                         "generation": 1, "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "me"}},
            "spec": {"tensorflow": {"worker": {"replicas": 2}}},
            **({"status": {"phase": phase}} if phase else {})}


def follow(api: ScriptedAPI, namespaces: list[str] | None = None, seconds: float = 0.2
           ) -> tuple[JobWatch, list[Key], list[tuple[str | None, str]]]:
    queued: list[Key] = []
    observed: list[tuple[str | None, str]] = []

    def observe(kind: str | None, body: Mapping[str, Any]) -> None:
        observed.append((kind, body["metadata"]["name"]))

    watch = JobWatch(api, ["ml"] if namespaces is None else namespaces,  # type: ignore[arg-type]
                     changed=queued.append, observed=observe)
    run_watch(watch, seconds)
    return watch, queued, observed


def test_a_listed_job_is_held_as_the_controller_reads_it() -> None:
    api = ScriptedAPI([[page([job("mnist")], "10", cont="next"), page([job("other", uid="uid-2")], "10")]], [])
    watch, queued, observed = follow(api)
    held = watch.view[("ml", "mnist")][0]
    assert held["spec"] == {"tensorflow": {"worker": {"replicas": 2}}} and held["status"] == {}
    assert "managedFields" not in held["metadata"] and held["metadata"]["annotations"] == {"keep": "me"}
    assert dict(held) == {"metadata": held["metadata"], "spec": held["spec"], "status": {}}
    assert queued == [("ml", "mnist"), ("ml", "other")] and observed == [(None, "mnist"), (None, "other")]
    assert api.requests[1]["continue"] == "next" and api.requests[0]["labelSelector"] == ""


def test_events_queue_a_job_when_what_is_held_changed() -> None:
    api = ScriptedAPI([[page([job("mnist")], "10")]], [[
        line("MODIFIED", job("mnist", version="11", phase="Running")),
        line("BOOKMARK", {"kind": "DistTrainJob", "metadata": {"resourceVersion": "12"}}),
        line("MODIFIED", job("mnist", version="11", phase="Running")),  # the same again: nothing to do
        line("ADDED", job("second", version="13", uid="uid-2")),
    ]])
    watch, queued, observed = follow(api)
    assert queued == [("ml", "mnist"), ("ml", "mnist"), ("ml", "second")]
    assert watch.view[("ml", "mnist")][0]["status"] == {"phase": "Running"}
    assert api.watched_from == ["10", "13"]
    assert observed[-1] == ("ADDED", "second")


def test_a_deleted_job_leaves_and_its_gauges_with_it() -> None:
    api = ScriptedAPI([[page([job("mnist"), job("other", uid="uid-2")], "10")]], [[
        line("DELETED", job("other", version="11", uid="uid-2")),
    ]])
    watch, queued, observed = follow(api)
    assert list(watch.view) == [("ml", "mnist")] and queued[-1] == ("ml", "other")
    assert observed[-1] == ("DELETED", "other")


def test_an_expired_version_lists_again_and_drops_what_went_meanwhile() -> None:
    api = ScriptedAPI([[page([job("mnist"), job("other", uid="uid-2")], "10")], [page([job("mnist")], "20")]],
                      [[line("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"})]])
    watch, queued, observed = follow(api)
    assert list(watch.view) == [("ml", "mnist")] and api.watched_from == ["10", "20"]
    assert queued[2:] == [("ml", "other")]  # the list's mnist is as held: not queued again
    assert ("DELETED", "other") in observed


def test_a_cluster_wide_watch_keeps_the_namespaces_its_globs_name() -> None:
    api = ScriptedAPI([[page([job("a", namespace="ml-team"), job("b", namespace="ml-test", uid="u2")], "10")]], [[
        line("ADDED", job("c", namespace="prod", uid="u3", version="11")),
    ]])
    watch, queued, _ = follow(api, namespaces=["ml-*, !ml-test"])
    assert list(watch.view) == [("ml-team", "a")] and queued == [("ml-team", "a")]
    assert api.requests[0].get("limit") == "500"


def test_the_decoders_keep_the_api_servers_bytes() -> None:
    body = job("mnist", phase="Running")
    kind, held = decode_event(json.dumps({"type": "ADDED", "object": body}).encode())
    assert kind == "ADDED" and isinstance(held, HeldJob)
    assert dict(held) == dict(HeldJob.of(body)) and held["status"] == {"phase": "Running"}
    jobs, version, token = decode_list(json.dumps(page([body], "7", cont="c")).encode())
    assert jobs == [held] and (version, token) == ("7", "c")
    kind, status = decode_event(json.dumps({"type": "ERROR", "object": {"code": 410}}).encode())
    assert (kind, status) == ("ERROR", {"code": 410})


def test_a_held_job_costs_its_json_not_its_objects() -> None:
    """The index holds spec and status as the API server's bytes: 300 jobs held cost under 2 KB each
    (tracemalloc), where decoded bodies are ~10 KB (issue 25)."""
    import tracemalloc

    raw = json.dumps(page([job(f"job-{i}", uid=f"uid-{i}") for i in range(300)], "10")).encode()
    api = ScriptedAPI([[json.loads(raw)]], [])
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    watch, _, _ = follow(api, seconds=0)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(watch.view) == 300
    assert held / 300 < 2048, f"{held / 300:.0f} bytes per job held"
