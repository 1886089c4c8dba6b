"""`Client`: submit a DistTrainJob, wait for it with its progress shown, read its logs, delete it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kubernetes import client

from disttrain.api.constants import GROUP, PLURAL, VERSION
from disttrain.client.connection import KubeLogSource, api_message, connect
from disttrain.client.joblogs import LogLine, job_logs
from disttrain.client.jobs import Job
from disttrain.client.progress import JobStatus, Progress, default_progress

FINISHED = ("Succeeded", "Failed")


class JobError(RuntimeError):
    """The API server refused a request about a job; the message is its own."""


class Client:
    """A namespace's DistTrainJobs. `Client()` uses the kubeconfig (or the pod's ServiceAccount)
    and its namespace, as kubectl would."""

    def __init__(self, namespace: str | None = None, *, kubeconfig: str | None = None, context: str | None = None,
                 api_client: client.ApiClient | None = None) -> None:
        if api_client is None:
            api_client, default_namespace = connect(kubeconfig, context)
        else:
            default_namespace = "default"
        self.api = api_client
        self.namespace = namespace or default_namespace
        self._custom = client.CustomObjectsApi(api_client)

    def submit(self, job: Job | Mapping[str, Any]) -> str:
        """Create the job (a `Job`, or a manifest as a dict); its name."""
        manifest = job.to_manifest(self.namespace) if isinstance(job, Job) else dict(job)
        namespace = (manifest.get("metadata") or {}).get("namespace") or self.namespace
        try:
            created = self._custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
        except client.ApiException as err:
            raise JobError(api_message(err)) from err
        return str(created["metadata"]["name"])

    def get(self, name: str) -> dict[str, Any]:
        """The job as the API server has it."""
        try:
            found: dict[str, Any] = self._custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                                              name)
        except client.ApiException as err:
            raise JobError(api_message(err)) from err
        return found

    def status(self, name: str) -> JobStatus:
        return JobStatus.of(self.get(name))

    def jobs(self) -> list[JobStatus]:
        """Every job of the namespace."""
        found = self._custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        return [JobStatus.of(job) for job in found.get("items", [])]

    def wait(self, name: str, until: Iterable[str] = FINISHED, *, timeout: float | None = None,
             progress: bool | Progress = True, interval: float = 1.0) -> JobStatus:
        """Until the job reaches a phase of `until` (by default Succeeded or Failed; "Running" to
        wait for its start), or has finished in another; its status then. The progress (phase,
        ready pods, restarts) is shown as it changes: a line each time in a terminal, one line kept
        current in a notebook, or given to `progress` if it is a function."""
        wanted = set(until)
        show = default_progress() if progress is True else progress or None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(name)
            if show is not None:
                show(status)
            if status.phase in wanted or status.finished:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{name} is still {status.phase or 'without a phase'} after {timeout}s: "
                                   f"{status.line()}")
            time.sleep(interval)

    def logs(self, name: str, *, follow: bool = False, replica_type: str | None = None,
             previous: bool = False) -> Iterator[LogLine]:
        """The job's log lines, each prefixed with its pod (`[worker-1] ...`); with `follow`, as they
        come, through restarts, until the job ends."""
        return job_logs(KubeLogSource(self.api), self.namespace, name, follow=follow, replica_type=replica_type,
                        previous=previous)

    def delete(self, name: str, *, wait: bool = False, timeout: float = 60) -> None:
        """Delete the job (its pods and other objects go with it); `wait`: until it is gone."""
        try:
            self._custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        except client.ApiException as err:
            if err.status != 404:
                raise JobError(api_message(err)) from err
        deadline = time.monotonic() + timeout
        while wait and time.monotonic() < deadline:
            try:
                self._custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
            except client.ApiException as err:
                if err.status == 404:
                    return
                raise
            time.sleep(0.5)
        if wait:
            raise TimeoutError(f"{name} still exists {timeout}s after it was deleted")

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
