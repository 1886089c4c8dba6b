"""A small stand-in for the API server's side of `disttrain logs`: a DistTrainJob, its pods, and
their container logs, in the API's own shapes (pods as the API serves them, a log as a stream of
bytes that a follow request keeps open until the container ends). Tests change it as a cluster
would: a worker writes, a container restarts, the operator replaces a pod, the job ends."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

JOB_LABEL, TYPE_LABEL = "disttrain.dev/job-name", "disttrain.dev/replica-type"
INDEX_LABEL = "disttrain.dev/replica-index"


class FakeLog:
    """One container instance's log."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.ended = False
        self.changed = threading.Condition()

    def write(self, data: bytes) -> None:
        with self.changed:
            self.chunks.append(data)
            self.changed.notify_all()

    def end(self) -> None:
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def read(self, follow: bool) -> FakeStream:
        return FakeStream(self, follow)


class FakeStream:
    """A log response: iterated as chunks arrive; close() ends it, as closing the connection does."""

    def __init__(self, log: FakeLog, follow: bool) -> None:
        self.log, self.follow, self.closed = log, follow, False

    def close(self) -> None:
        with self.log.changed:
            self.closed = True
            self.log.changed.notify_all()

    def __iter__(self) -> Iterator[bytes]:
        sent, log = 0, self.log
        while True:
            with log.changed:
                while self.follow and sent == len(log.chunks) and not log.ended and not self.closed:
                    log.changed.wait()
                new, sent = log.chunks[sent:], len(log.chunks)
                done = log.ended or not self.follow or self.closed
            yield from new
            if done:
                return


class FakeLogSource:
    def __init__(self, namespace: str = "ns", job: str = "mnist") -> None:
        self.namespace, self.name, self.uid = namespace, job, str(uuid.uuid4())
        self.phase: str | None = "Running"
        self.deleted = False
        self._pods: dict[str, dict[str, Any]] = {}
        self._logs: dict[tuple[str, str, int], FakeLog] = {}  # (pod uid, container, instance)
        self.broken: set[str] = set()  # pods whose log requests fail, as a KWOK pod's do
        self.lock = threading.Lock()

    # -- what a test does ---------------------------------------------------------------------

    def add_pod(self, rtype: str, index: int, containers: tuple[str, ...] = ("tensorflow",),
                started: bool = True, owner: str | None = None) -> str:
        name = f"{self.name}-launcher" if rtype == "launcher" else f"{self.name}-{rtype}-{index}"
        uid = str(uuid.uuid4())
        state = {"running": {"startedAt": "2026-01-01T00:00:00Z"}} if started else {"waiting": {"reason": "Pending"}}
        with self.lock:
            self._pods[name] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "uid": uid,
                             "labels": {JOB_LABEL: self.name, TYPE_LABEL: rtype, INDEX_LABEL: str(index)},
                             "ownerReferences": [{"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob",
                                                  "name": self.name, "uid": owner or self.uid, "controller": True}]},
                "spec": {"containers": [{"name": c, "image": "disttrain/tensorflow:2.21"} for c in containers]},
                "status": {"phase": "Running" if started else "Pending", "containerStatuses": [
                    {"name": c, "restartCount": 0, "ready": started, "state": dict(state), "lastState": {}}
                    for c in containers]},
            }
            for c in containers:
                self._logs[(uid, c, 0)] = FakeLog()
        return name

    def write(self, pod: str, text: str, container: str | None = None) -> None:
        self._current(pod, container).write(text.encode())

    def start(self, pod: str) -> None:
        with self.lock:
            for cs in self._pods[pod]["status"]["containerStatuses"]:
                cs["state"] = {"running": {"startedAt": "2026-01-01T00:00:01Z"}}

    def exit(self, pod: str, code: int = 0, container: str | None = None) -> None:
        """The container ends: its log stream too."""
        log = self._current(pod, container)
        with self.lock:
            cs = self._status(pod, container)
            cs["state"] = {"terminated": {"exitCode": code}}
        log.end()

    def restart_container(self, pod: str, container: str | None = None) -> None:
        """The kubelet starts the container again (restartPolicy OnFailure): a new log."""
        self.exit(pod, 1, container)
        with self.lock:
            cs = self._status(pod, container)
            cs["lastState"], cs["restartCount"] = cs["state"], cs["restartCount"] + 1
            cs["state"] = {"running": {"startedAt": "2026-01-01T00:01:00Z"}}
            self._logs[(self._pods[pod]["metadata"]["uid"], cs["name"], cs["restartCount"])] = FakeLog()

    def delete_pod(self, pod: str) -> None:
        with self.lock:
            gone = self._pods.pop(pod)
        for (uid, _, _), log in list(self._logs.items()):
            if uid == gone["metadata"]["uid"]:
                log.end()

    # -- the API's side (disttrain.client.joblogs.LogSource) -----------------------------------------

    def job(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if self.deleted or (namespace, name) != (self.namespace, self.name):
            return None
        return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob",
                "metadata": {"name": name, "namespace": namespace, "uid": self.uid},
                "status": {"phase": self.phase} if self.phase else {}}

    def pods(self, namespace: str, label_selector: str) -> list[Mapping[str, Any]]:
        wanted = dict(term.split("=", 1) for term in label_selector.split(",") if term)
        with self.lock:
            return [_copy(p) for p in self._pods.values() if namespace == self.namespace and
                    all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]

    def log(self, namespace: str, pod: str, container: str, *, follow: bool, previous: bool) -> FakeStream:
        with self.lock:
            if pod not in self._pods or pod in self.broken:
                raise LookupError(f'pods "{pod}" not found' if pod not in self._pods else "no kubelet to ask")
            uid = self._pods[pod]["metadata"]["uid"]
            instance = self._status(pod, container)["restartCount"] - (1 if previous else 0)
            log = self._logs.get((uid, container, instance))
        if log is None:
            raise LookupError(f'previous terminated container "{container}" in pod "{pod}" not found')
        return log.read(follow)

    # -- helpers ------------------------------------------------------------------------------

    def _status(self, pod: str, container: str | None) -> dict[str, Any]:
        statuses = self._pods[pod]["status"]["containerStatuses"]
        return next(cs for cs in statuses if container in (None, cs["name"]))

    def _current(self, pod: str, container: str | None) -> FakeLog:
        with self.lock:
            cs = self._status(pod, container)
            return self._logs[(self._pods[pod]["metadata"]["uid"], cs["name"], cs["restartCount"])]


def _copy(pod: dict[str, Any]) -> dict[str, Any]:
    import copy

    return copy.deepcopy(pod)
