"""The benchmark's baseline: a plain async client making the API writes the operator must make
for the same jobs, built by the operator's own pure builders, with the operator's concurrency
(16 jobs at once). It is the API server's limit on this machine: the operator can't beat it.

Each job is the same object a user applies, as a PlainTrainJob: a CRD that is the DistTrainJob's
whole, its schema and CEL rules included, under another group (`plain_crd`), which no operator
watches. The API server validates its create and its status writes as it does a DistTrainJob's.
Until 2026-11 a ConfigMap stood for the job, which the API server checks against no schema. Measured
since, the schema was not what set the two sides apart: with the plain side's answers read as bytes
and its pods out of the operator's watch (both below), 1,000 jobs took 38.8-41.0 s either way.

Its writes are the operator's for the same job (issue 45: "the plain client doing the same writes"):
the Service, the pods, phase Pending once they are made, and phase Running with its event once they
all run (`mark_running`). Until 2026-11-29 it wrote neither the Running phase nor the event, which
the operator writes while the burst's later jobs are still being made: 2 writes a job of the
operator's 9.5 that the baseline didn't make. What the operator writes beyond these (a ready count
that waited 5 s, `control/status_writes.py`) is its own cost.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from bench_observe import PLAIN_GROUP, PLAIN_JOB_LABEL, PLAIN_KIND, PLAIN_PLURAL, watch_forever
from disttrain.api.constants import JOB_NAME_LABEL, REPLICA_TYPE_LABEL
from disttrain.api.crd import crd
from disttrain.api.objects import JobRef
from disttrain.api.parse import parse_spec
from disttrain.api.status import timestamp
from disttrain.apiserver.kube import event_body
from disttrain.builders.desired import job_pod, supporting_objects
from disttrain.builders.pods import desired_pod_keys

WORKERS = 16  # the operator's default --workers


def plain_crd() -> dict[str, Any]:
    """The DistTrainJob CRD under the bench's group and kind: what the API server does with each
    job's create and status writes is the same; no operator watches it."""
    out = crd()
    spec = out["spec"]
    spec["group"] = PLAIN_GROUP
    spec["names"] = {"kind": PLAIN_KIND, "listKind": f"{PLAIN_KIND}List", "plural": PLAIN_PLURAL,
                     "singular": PLAIN_KIND.lower()}
    out["metadata"] = {"name": f"{PLAIN_PLURAL}.{PLAIN_GROUP}"}
    return out


def as_plain(obj: dict[str, Any]) -> None:
    """A child as the operator builds it, made the plain job's: owned by its PlainTrainJob (the
    garbage collector's graph as the operator's children are in it), and its job label under the
    bench's key, so that the running operator's pod watch (a selector on the job label) is never sent
    the plain side's pods, nor the Service's selector theirs."""
    meta = obj["metadata"]
    for ref in meta.get("ownerReferences") or ():
        ref.update(apiVersion=f"{PLAIN_GROUP}/v1", kind=PLAIN_KIND)
    for labels in (meta.get("labels"), (obj.get("spec") or {}).get("selector")):
        if isinstance(labels, dict) and JOB_NAME_LABEL in labels:
            labels[PLAIN_JOB_LABEL] = labels.pop(JOB_NAME_LABEL)


class PlainClient:
    def __init__(self, api: Any, manifest: Mapping[str, Any]) -> None:
        from kubernetes_asyncio import client

        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.api = api
        self.manifest = {**manifest, "apiVersion": f"{PLAIN_GROUP}/v1", "kind": PLAIN_KIND}
        self.spec = parse_spec(dict(manifest["spec"]))
        self.pods_per_job = len(desired_pod_keys(self.spec))
        self.gate = asyncio.Semaphore(WORKERS)
        self.uids: dict[tuple[str, str], str] = {}

    async def create_job(self, ns: str, name: str) -> str:
        """The job object: what a user's `kubectl apply` makes. Returns its UID."""
        created = await self.send(self.custom.create_namespaced_custom_object,
                                  PLAIN_GROUP, "v1", ns, PLAIN_PLURAL, {**self.manifest, "metadata": {"name": name}})
        return str(json.loads(created)["metadata"]["uid"])

    async def write_phase(self, ns: str, name: str, phase: str) -> None:
        await self.send(self.custom.patch_namespaced_custom_object_status, PLAIN_GROUP, "v1", ns, PLAIN_PLURAL, name,
                        {"status": {"phase": phase}}, _content_type="application/merge-patch+json")

    @staticmethod
    async def send(call: Any, *args: Any, **kwargs: Any) -> bytes:
        """One request, its answer's bytes unread into client models: the operator decodes its
        answers with msgspec (or not at all), and kubernetes_asyncio's models cost this process,
        which shares the machine's two cores with the API server, ~1 ms a pod."""
        resp = await call(*args, _preload_content=False, **kwargs)
        async with resp:
            body: bytes = await resp.read()
            if not 200 <= resp.status < 300:
                raise RuntimeError(f"{resp.status} from the API server: {body[:300]!r}")
        return body

    async def start_job(self, ns: str, name: str, uid: str) -> None:
        """Its Service, its pods (concurrently), and one status write: the minimum for a job whose
        pods all exist."""
        ref = JobRef(name, ns, uid)
        objects = [*supporting_objects(ref, self.spec, None), *(job_pod(ref, self.spec, k)
                                                                for k in desired_pod_keys(self.spec))]
        for obj in objects:
            as_plain(obj)
        async with self.gate:
            for obj in objects:
                if obj["kind"] == "Service":
                    await self.send(self.core.create_namespaced_service, ns, obj)
            await asyncio.gather(*(self.send(self.core.create_namespaced_pod, ns, p) for p in objects
                                   if p["kind"] == "Pod"))
            await self.write_phase(ns, name, "Pending")

    async def submit(self, ns: str, name: str) -> None:
        uid = self.uids[(ns, name)] = await self.create_job(ns, name)
        await self.start_job(ns, name, uid)

    async def mark_running(self, ns: str, jobs: int, stop: asyncio.Event) -> None:
        """The operator's writes once a job's pods all run: phase Running, and its event
        (AllPodsRunning, as the operator's pass makes it: decide/reconcile.py). Returns when `jobs`
        jobs are marked, at `stop`, or past 600 s."""
        running: dict[str, set[str]] = {}
        marked: set[str] = set()
        pending: list[asyncio.Task[None]] = []

        async def mark(job: str) -> None:
            async with self.gate:
                await self.write_phase(ns, job, "Running")
                event = event_body(ns, job, self.uids[(ns, job)], "Normal", "AllPodsRunning",
                                   f"all {len(running[job])} pods are running", "bench-plain",
                                   timestamp(datetime.datetime.now(datetime.UTC)))
                await self.send(self.core.create_namespaced_event, ns, event)

        def on_pod(kind: str, pod: dict[str, Any]) -> None:
            job = (pod["metadata"].get("labels") or {}).get(PLAIN_JOB_LABEL, "")
            if kind == "DELETED" or job in marked or (pod.get("status") or {}).get("phase") != "Running":
                return
            pods = running.setdefault(job, set())
            pods.add(pod["metadata"]["name"])
            if len(pods) == self.pods_per_job:
                marked.add(job)
                pending.append(asyncio.create_task(mark(job)))

        await self.on_pods_until(ns, on_pod, lambda: len(marked) >= jobs, pending, stop)

    async def finish_when_chief_done(self, ns: str, jobs: int, stop: asyncio.Event) -> None:
        """The completion half: watch the namespace's pods; when a job's chief has succeeded, write
        its phase Succeeded, then delete its other pods (the operator's order and policy)."""
        done: set[str] = set()
        running: dict[str, set[str]] = {}
        pending: list[asyncio.Task[None]] = []

        async def finish(job: str) -> None:
            async with self.gate:
                await self.write_phase(ns, job, "Succeeded")
                await asyncio.gather(*(self.send(self.core.delete_namespaced_pod, p, ns) for p in running.get(job, ())))

        def on_pod(kind: str, pod: dict[str, Any]) -> None:
            meta = pod["metadata"]
            labels = meta.get("labels") or {}
            job = labels.get(PLAIN_JOB_LABEL, "")
            if labels.get(REPLICA_TYPE_LABEL) != "chief":
                if kind != "DELETED" and not meta.get("deletionTimestamp"):
                    running.setdefault(job, set()).add(meta["name"])
                return
            if (pod.get("status") or {}).get("phase") == "Succeeded" and job not in done:
                done.add(job)
                pending.append(asyncio.create_task(finish(job)))

        await self.on_pods_until(ns, on_pod, lambda: len(done) >= jobs, pending, stop)

    async def on_pods_until(self, ns: str, on_pod: Callable[[str, dict[str, Any]], None], done: Callable[[], bool],
                            pending: list[asyncio.Task[None]], stop: asyncio.Event, timeout: float = 600) -> None:
        """The namespace's plain pods, each event to `on_pod`, until `done()` (or `timeout`, or `stop`);
        then the writes it started (`pending`)."""
        watcher = asyncio.create_task(watch_forever(
            self.api, f"/api/v1/namespaces/{ns}/pods?labelSelector={PLAIN_JOB_LABEL}", on_pod, stop))
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline and not stop.is_set():
            await asyncio.sleep(0.05)
        await asyncio.gather(*pending)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
