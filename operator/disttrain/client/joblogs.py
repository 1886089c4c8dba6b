"""The logs of a whole job: every container of every pod, each line prefixed with where it came
from (`[worker-1]`), interleaved as the lines arrive, following pods as a restart replaces them,
until the job ends.

This module decides and merges; it reads through a `LogSource`, which answers in the API's own
shapes (a DistTrainJob and pods as the API server serves them, a container log as the bytes of
`GET .../pods/<name>/log`). `disttrain.client` gives it the real API; tests give it a fake.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from disttrain.api.constants import JOB_NAME_LABEL, REPLICA_INDEX_LABEL, REPLICA_TYPE_LABEL
from disttrain.api.objects import controller_uid

FINISHED_PHASES = ("Succeeded", "Failed")


class LogSource(Protocol):
    def job(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The DistTrainJob, or None once it is gone."""

    def pods(self, namespace: str, label_selector: str) -> list[Mapping[str, Any]]:
        """The pods the selector picks (a PodList's items)."""

    def log(self, namespace: str, pod: str, container: str, *, follow: bool, previous: bool) -> Iterable[bytes]:
        """A container's log as the API streams it: chunks of bytes, until the container ends
        (follow) or at once. May have a close() that ends it early."""


@dataclass(frozen=True)
class StreamKey:
    pod_uid: str
    pod: str
    container: str
    instance: int  # the container's restartCount: a restarted container's log is a new stream
    source: str = field(compare=False)  # what its lines are prefixed with
    previous: bool = field(default=False, compare=False)  # read as the container before the current one


@dataclass(frozen=True)
class LogLine:
    source: str  # worker-1, launcher, chief-0/sidecar
    text: str
    error: bool = False  # the log could not be read: the text says why

    def __str__(self) -> str:
        return f"[{self.source}] {self.text}"


def selector(job: str, replica_type: str | None = None) -> str:
    found = f"{JOB_NAME_LABEL}={job}"
    return f"{found},{REPLICA_TYPE_LABEL}={replica_type}" if replica_type else found


def source_name(pod: Mapping[str, Any], container: str) -> str:
    """`worker-1`; `launcher` for the MPI launcher; `/container` added for a pod of several."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    rtype = labels.get(REPLICA_TYPE_LABEL, "")
    name = rtype if rtype == "launcher" else f"{rtype}-{labels.get(REPLICA_INDEX_LABEL, '?')}"
    containers = (pod.get("spec") or {}).get("containers") or []
    return f"{name}/{container}" if len(containers) > 1 else name


def _order(pod: Mapping[str, Any]) -> tuple[str, int]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    index = str(labels.get(REPLICA_INDEX_LABEL, "0"))
    return str(labels.get(REPLICA_TYPE_LABEL, "")), int(index) if index.isdigit() else 0


def streams(pods: Iterable[Mapping[str, Any]], job_uid: str, *, previous: bool = False,
            earlier: bool = False) -> list[StreamKey]:
    """The container logs there are to read, in pod order: of containers that have started (a
    waiting container has no log yet). `previous`: only those that ran before a restart.
    `earlier`: those too, before the current ones (following, a container that died and was
    started again between two looks is read as the previous one)."""
    found = []
    for pod in sorted((p for p in pods if controller_uid(p.get("metadata") or {}) == job_uid), key=_order):
        meta = pod.get("metadata") or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            container, restarts = status.get("name", ""), int(status.get("restartCount") or 0)
            key = functools.partial(StreamKey, meta.get("uid", ""), meta.get("name", ""), container,
                                    source=source_name(pod, container))
            if (previous or earlier) and restarts and "terminated" in (status.get("lastState") or {}):
                found.append(key(restarts - 1, previous=True))
            if not previous and _started(status.get("state") or {}):
                found.append(key(restarts))
    return found


def _started(state: Mapping[str, Any]) -> bool:
    return "running" in state or "terminated" in state


def lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Whole lines out of chunks cut anywhere; a last line without a newline too."""
    rest = b""
    for chunk in chunks:
        rest += chunk
        *whole, rest = rest.split(b"\n")
        for line in whole:
            yield line.rstrip(b"\r").decode(errors="replace")
    if rest:
        yield rest.decode(errors="replace")


class JobNotFound(LookupError):
    pass


def job_logs(source: LogSource, namespace: str, name: str, *, follow: bool = False, replica_type: str | None = None,
             previous: bool = False, poll: float = 1.0, linger: float = 10.0) -> Iterator[LogLine]:
    """The job's log lines. Without `follow`: what each container has logged so far, pod after pod
    (`previous`: of the container before its last restart). With it: as lines arrive, from every
    container as it starts, until the job has ended and its streams with it (at most `linger`
    seconds more: a pod cleanPodPolicy keeps may run on)."""
    job = source.job(namespace, name)
    if job is None:
        raise JobNotFound(f"no DistTrainJob {namespace}/{name}")
    uid = (job.get("metadata") or {}).get("uid", "")
    pods = source.pods(namespace, selector(name, replica_type))
    if not follow or previous:
        for key in streams(pods, uid, previous=previous):
            yield from _read(source, namespace, key)
        return
    yield from _Follower(source, namespace, name, uid, selector(name, replica_type)).run(poll, linger)


def _read(source: LogSource, namespace: str, key: StreamKey) -> Iterator[LogLine]:
    try:
        for text in lines(source.log(namespace, key.pod, key.container, follow=False, previous=key.previous)):
            yield LogLine(key.source, text)
    except Exception as err:  # one container's log lost must not end the others'
        yield unavailable(key, err)


def unavailable(key: StreamKey, err: Exception) -> LogLine:
    return LogLine(key.source, f"(no log from pod {key.pod} container {key.container}: {err})", error=True)


class _Follower:
    """One thread per container log, all feeding one queue; the caller's thread polls the job and
    its pods, starts the new streams, and hands out the lines."""

    def __init__(self, source: LogSource, namespace: str, name: str, uid: str, label_selector: str) -> None:
        self.source, self.namespace, self.name, self.uid, self.selector = source, namespace, name, uid, label_selector
        self.queue: queue.Queue[LogLine | StreamKey] = queue.Queue()  # a StreamKey: that stream ended
        self.opened: set[StreamKey] = set()
        self.running: set[StreamKey] = set()
        self.handles: dict[StreamKey, Iterable[bytes]] = {}

    def run(self, poll: float, linger: float) -> Iterator[LogLine]:
        ended_at: float | None = None
        try:
            while True:
                job = self.source.job(self.namespace, self.name)
                if ended_at is None and job_ended(job, self.uid):
                    ended_at = time.monotonic()
                # Pods after the job: a container that ended with the job is still started here.
                self._start(self.source.pods(self.namespace, self.selector))
                if ended_at is not None and (not self.running or time.monotonic() - ended_at > linger):
                    yield from self._drain(0)
                    return
                yield from self._drain(poll)
        finally:
            for handle in list(self.handles.values()):
                _close(handle)

    def _start(self, pods: list[Mapping[str, Any]]) -> None:
        """Open the new streams. Their first lines go through the queue like all others, behind
        what earlier streams have already queued: a restarted container's log comes after its
        predecessor's."""
        seen = {key.source for key in self.opened}
        for key in streams(pods, self.uid, earlier=True):
            if key in self.opened:
                continue
            if key.source in seen:
                self.queue.put(LogLine(key.source, f"--- restarted: pod {key.pod}, container {key.container} "
                                                   f"(restart {key.instance}) ---"))
            seen.add(key.source)
            self.opened.add(key)
            if key.previous:  # ended already: all there, read before its successor starts
                for line in _read(self.source, self.namespace, key):
                    self.queue.put(line)
                continue
            self.running.add(key)
            threading.Thread(target=self._pump, args=(key,), daemon=True, name=f"log {key.pod}").start()

    def _pump(self, key: StreamKey) -> None:
        try:
            chunks = self.source.log(self.namespace, key.pod, key.container, follow=True, previous=False)
            self.handles[key] = chunks
            for text in lines(chunks):
                self.queue.put(LogLine(key.source, text))
        except Exception as err:  # one container's log lost must not end the others'
            self.queue.put(unavailable(key, err))
        finally:
            self.queue.put(key)

    def _drain(self, seconds: float) -> Iterator[LogLine]:
        """Hand out what arrives within `seconds` (what is there already, for 0)."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            try:
                item = self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, StreamKey):
                self.running.discard(item)
                self.handles.pop(item, None)
            else:
                yield item


def _close(stream: Iterable[bytes]) -> None:
    """End a stream another thread may be reading (an HTTP response): best effort, we are leaving."""
    close = getattr(stream, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):  # what is left of it dies with its daemon thread
            close()


def job_ended(job: Mapping[str, Any] | None, uid: str) -> bool:
    """Succeeded or Failed, deleted, or made again under the same name (another job)."""
    if job is None or (job.get("metadata") or {}).get("uid") != uid:
        return True
    return (job.get("status") or {}).get("phase") in FINISHED_PHASES
