"""What `make bench` sees: a timeline of pod and job events (DistTrainJobs, and the plain client's
PlainTrainJobs), each stamped with the monotonic time it arrived; the operator process's memory and
CPU; and the audit log's count of one user's requests.

The watches read raw JSON lines, not client models: building a model per event would cost the
bench more CPU than the work it measures, and the operator and the plain client share these two
cores with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOB_LABEL = "disttrain.dev/job-name"
OPERATOR_USER, PLAIN_USER = "disttrain-operator", "disttrain-plain"  # the audit log's users (AuditLog)
CHECKPOINT_FILE_LABEL = "disttrain.dev/checkpoint-file"
# The plain client's jobs (bench_plain.py): the DistTrainJob's CRD under another group and kind.
PLAIN_GROUP, PLAIN_KIND, PLAIN_PLURAL = "bench.disttrain.dev", "PlainTrainJob", "plaintrainjobs"
PLAIN_JOB_LABEL = "bench.disttrain.dev/job-name"  # their pods' job label: the operator's pod watch never sees them
Key = tuple[str, str]  # (namespace, name)


@dataclass
class Timeline:
    pod_added: dict[Key, float] = field(default_factory=dict)
    pod_uids: dict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    pods_of_job: dict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    pod_succeeded: dict[Key, float] = field(default_factory=dict)
    pod_deleting: dict[Key, float] = field(default_factory=dict)  # deletionTimestamp seen, or gone
    phase_seen: dict[Key, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))  # jobs, both kinds
    pod_phase: dict[Key, str] = field(default_factory=dict)
    running: Counter[str] = field(default_factory=Counter)  # pods Running now, by namespace
    job_events: Counter[Key] = field(default_factory=Counter)  # a job's watch events: its writes
    # The checkpoint requests (bench_large.py): when each pod was first seen with the annotation, and
    # which pods can hear one (the label the operator puts on them).
    watch_annotations: tuple[str, ...] = ()
    annotated: dict[tuple[Key, str], float] = field(default_factory=dict)
    hears_checkpoint: set[Key] = field(default_factory=set)

    def on_pod(self, kind: str, pod: dict[str, Any], now: float) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if key not in self.pod_added:
            self.pod_added[key] = now
        self.pod_uids[key].add(meta["uid"])
        labels = meta.get("labels") or {}
        job = labels.get(JOB_LABEL) or labels.get(PLAIN_JOB_LABEL)
        if job:
            self.pods_of_job[(meta["namespace"], job)].add(meta["name"])
        if CHECKPOINT_FILE_LABEL in labels:
            self.hears_checkpoint.add(key)
        for annotation in self.watch_annotations:
            if annotation in (meta.get("annotations") or {}):
                self.annotated.setdefault((key, annotation), now)
        phase = "" if kind == "DELETED" else (pod.get("status") or {}).get("phase", "")
        if phase == "Succeeded":
            self.pod_succeeded.setdefault(key, now)
        was = self.pod_phase.get(key)
        if was != phase:
            self.running[key[0]] += (phase == "Running") - (was == "Running")
            self.pod_phase[key] = phase
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            self.pod_deleting.setdefault(key, now)

    def on_phase(self, key: Key, phase: str | None, now: float) -> None:
        if phase:
            self.phase_seen[key].setdefault(phase, now)

    def job_pods_complete(self, job: Key, count: int) -> float | None:
        """When the last of a job's `count` pods was first seen."""
        names = self.pods_of_job.get(job, set())
        if len(names) < count:
            return None
        return max(self.pod_added[(job[0], n)] for n in names)

    def pods_in(self, namespace: str) -> int:
        return sum(1 for ns, _ in self.pod_added if ns == namespace)

    def duplicates(self, namespace: str) -> list[str]:
        """Pod names created more than once (a new UID under a name: nothing in the bench restarts)."""
        return sorted(n for (ns, n), uids in self.pod_uids.items() if ns == namespace and len(uids) > 1)


async def watch_forever(api: Any, path: str, on_event: Callable[[str, dict[str, Any]], None],
                        stop: asyncio.Event) -> None:
    """LIST then WATCH `path` (a collection URL), raw; list again after a 410, a closed stream or
    an error (said once per kind, on stderr)."""
    said: set[str] = set()
    while not stop.is_set():
        try:
            await _list_and_watch(api, path, on_event, stop)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            if type(err).__name__ not in said:
                said.add(type(err).__name__)
                print(f"  (watch {path}: {err!r}; listing again)", file=sys.stderr, flush=True)
            await asyncio.sleep(0.5)


async def _list_and_watch(api: Any, path: str, on_event: Callable[[str, dict[str, Any]], None],
                          stop: asyncio.Event) -> None:
    while not stop.is_set():
        listed = await _get_json(api, path)
        for item in listed.get("items", []):
            on_event("ADDED", item)
        version = listed["metadata"]["resourceVersion"]
        sep = "&" if "?" in path else "?"
        while not stop.is_set():
            url = f"{path}{sep}watch=1&allowWatchBookmarks=true&timeoutSeconds=240&resourceVersion={version}"
            gone = False
            async for event in _stream(api, url, stop):
                if event["type"] == "BOOKMARK":
                    version = event["object"]["metadata"]["resourceVersion"]
                elif event["type"] == "ERROR":
                    gone = True
                    break
                else:
                    version = event["object"]["metadata"]["resourceVersion"]
                    on_event(event["type"], event["object"])
            if gone:
                break


async def _get_json(api: Any, path: str) -> dict[str, Any]:
    resp = await api.call_api(path, "GET", auth_settings=["BearerToken"], _preload_content=False)
    async with resp:
        return dict(json.loads(await resp.read()))


async def _stream(api: Any, path: str, stop: asyncio.Event) -> Any:
    resp = await api.call_api(path, "GET", auth_settings=["BearerToken"], _preload_content=False,
                              _request_timeout=300)
    async with resp:
        buffer = b""
        while not stop.is_set():
            chunk = await resp.content.readany()
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def start_watches(api: Any, timeline: Timeline, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    def pod(kind: str, obj: dict[str, Any]) -> None:
        timeline.on_pod(kind, obj, time.monotonic())

    def job(_: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        timeline.job_events[(meta["namespace"], meta["name"])] += 1
        timeline.on_phase((meta["namespace"], meta["name"]), (obj.get("status") or {}).get("phase"), time.monotonic())

    watches: list[tuple[str, Callable[[str, dict[str, Any]], None]]] = [
        (f"/api/v1/pods?labelSelector={JOB_LABEL}", pod),
        (f"/api/v1/pods?labelSelector={PLAIN_JOB_LABEL}", pod),
        ("/apis/disttrain.dev/v1/disttrainjobs", job),
        (f"/apis/{PLAIN_GROUP}/v1/{PLAIN_PLURAL}", job),
    ]
    return [asyncio.create_task(watch_forever(api, path, handler, stop)) for path, handler in watches]


async def until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> float:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(interval)
    return time.monotonic()


async def gather_limited(limit: int, jobs: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await job()
    return list(await asyncio.gather(*(one(j) for j in jobs)))


@dataclass(frozen=True)
class Usage:
    rss_bytes: int
    cpu_seconds: float


def process_usage(pid: int) -> Usage:
    """Resident memory (VmRSS) and user+system CPU seconds of a process, from /proc."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return Usage(rss, (int(fields[11]) + int(fields[12])) / ticks)


def pss_bytes(pid: int) -> int:
    """Proportional set size: resident pages, each shared one divided among the processes sharing it
    (a module both of the operator's processes map counts once in their sum, not twice as RSS does)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):  # gone meanwhile
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                found += [int(child), *descendants(int(child))]
    return found


def is_endpoint(pid: int) -> bool:
    """The progress endpoint's process: forked (named progress-endpt) or started by exec."""
    try:
        return (Path(f"/proc/{pid}/comm").read_text().strip() == "progress-endpt"
                or "disttrain.endpoint" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"))
    except OSError:
        return False


def operator_memory(pid: int) -> dict[str, float]:
    """The whole operator's memory in MB of PSS: the controller (`pid`), the progress endpoint (the chart's
    default), any other child (the endpoint's first process while it waits: endpoint/prefork.py) and
    their sum (issue 45). A page the processes share counts once in the sum, split among them."""
    controller, endpoint, other = pss_bytes(pid), 0, 0
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            if is_endpoint(child):
                endpoint += pss_bytes(child)
            else:
                other += pss_bytes(child)
    return {"controller_mb": controller / 2**20, "endpoint_mb": endpoint / 2**20, "other_mb": other / 2**20,
            "sum_mb": (controller + endpoint + other) / 2**20}


class AuditLog:
    """Counts of one user's requests in the API server's audit log (LocalCluster.audit_users),
    by verb and resource (`status` and other subresources named `pods/status`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def since_mark(self, user: str) -> Counter[str]:
        counts: Counter[str] = Counter()
        if not self.path.exists():
            return counts
        with self.path.open("rb") as log:
            log.seek(self.offset)
            for line in log:
                event = json.loads(line)
                if event.get("user", {}).get("username") != user or event.get("stage") != "ResponseComplete":
                    continue
                ref = event.get("objectRef") or {}
                resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                code = event.get("responseStatus", {}).get("code", 0)
                counts[f"{event['verb']} {resource}" + (f" ({code})" if code >= 400 else "")] += 1
        return counts
