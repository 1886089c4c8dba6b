"""`make bench`'s large jobs (issue 45): one job of 1,024 workers in each shape, on KWOK nodes.

- TensorFlow, MultiWorkerMirrored's shape (workers only), gang-scheduled by Kubernetes' Workload API:
  TF_CONFIG lists all 1,024 (128 KiB in the longest names; short ones here), each pod reading the
  cluster from the job's ConfigMap.
- MPI over SSH: a launcher and 1,024 workers, the hostfile and discover_hosts.sh listing them all.

For each: apply -> the first pod (TF_CONFIG complete in it) or the hostfile (the ConfigMap, made before
any pod), apply -> every pod, apply -> every pod Running (the gang admitted whole), the operator's
status writes for the job meanwhile (one per pass at most, whatever the pod count), its CPU seconds;
then `suspend: true`: the checkpoint request on every pod that can hear one, how long from the patch
to the last (the goal: within 2 s for 1,024).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bench_observe import OPERATOR_USER, gather_limited, process_usage, until

LARGE_WORKERS = 1024
CHECKPOINT_REQUEST = "disttrain.dev/checkpoint-request"
CLUSTER_ENV = "DISTTRAIN_TF_CLUSTER"  # builders/tensorflow.py
PLAIN_POKE = "bench.disttrain.dev/poke"  # the plain client's annotation, the baseline of the fan-out


def _replica(n: int, **extra: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "train", **extra}
    return {"replicas": n, "restartPolicy": "ExitCode", "template": {"spec": {"containers": [container]}}}


def tf_job(name: str, workers: int) -> dict[str, Any]:
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name},
            "spec": {"tensorflow": {"worker": _replica(workers)},
                     "runPolicy": {"scheduling": {"gang": {"provider": "Kubernetes"}}}}}


def mpi_job(name: str, workers: int) -> dict[str, Any]:
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name},
            "spec": {"mpi": {"slotsPerWorker": 1, "launcher": _replica(1, command=["mpirun", "python", "train.py"]),
                             "worker": _replica(workers)}}}


async def one(bench: Any, shape: str, workers: int) -> dict[str, Any]:
    """One large job from apply to its checkpoint request, then its namespace deleted."""
    name = "big"
    manifest = tf_job(name, workers) if shape == "tensorflow" else mpi_job(name, workers)
    pods = workers + (shape == "mpi")
    ns = await bench.namespace(f"large-{shape[:2]}")
    job = (ns, name)
    cpu_before = process_usage(bench.operator_pid).cpu_seconds
    bench.audit.mark()
    started = time.monotonic()
    await bench.custom.create_namespaced_custom_object("disttrain.dev", "v1", ns, "disttrainjobs", manifest)
    out: dict[str, Any] = {"workers": workers, "pods": pods}
    if shape == "mpi":
        out["apply_to_hostfile_s"] = await _hostfile(bench, ns, f"{name}-mpi", workers) - started
    await until(lambda: len(bench.timeline.pods_of_job.get(job, ())) >= pods, 900, f"{pods} pods of {ns}/{name}")
    added = [bench.timeline.pod_added[(ns, pod)] for pod in bench.timeline.pods_of_job[job]]
    out["apply_to_first_pod_s"], out["apply_to_all_pods_s"] = min(added) - started, max(added) - started
    if shape == "tensorflow":
        out["tf_config_members"] = await _tf_config_members(bench, ns, f"{name}-worker-0")
    await bench.until_running(ns, pods)
    out["apply_to_all_running_s"] = time.monotonic() - started
    await asyncio.sleep(2.5)  # the audit log is written in batches of up to 1 s
    writes = bench.audit.since_mark(OPERATOR_USER)
    out["status_writes"] = sum(n for verb, n in writes.items() if verb.endswith("disttrainjobs/status"))
    out["operator_cpu_s"] = process_usage(bench.operator_pid).cpu_seconds - cpu_before
    out |= await _checkpoint_fan_out(bench, ns, name)
    print(f"  large {shape}: {pods} pods in {out['apply_to_all_pods_s']:.1f} s (first "
          f"{out['apply_to_first_pod_s']:.2f} s), Running {out['apply_to_all_running_s']:.1f} s; "
          f"{out['status_writes']} status writes; checkpoint request on {out['checkpoint_pods']} pods in "
          f"{out['checkpoint_fan_out_s']:.2f} s", flush=True)
    await bench.drop(ns)
    return out


async def _hostfile(bench: Any, ns: str, config_map: str, workers: int) -> float:
    """When the job's ConfigMap first listed every worker (polled: it is made before any pod)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            found = await bench.core.read_namespaced_config_map(config_map, ns)
        except ApiException as err:
            if err.status != 404:
                raise
        else:
            if len((found.data or {}).get("hostfile", "").splitlines()) == workers:
                return time.monotonic()
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no hostfile of {workers} workers in {ns}/{config_map}")


async def _tf_config_members(bench: Any, ns: str, pod: str) -> int:
    """The members the pod's process would see in TF_CONFIG: past a size, the pod reads its cluster
    from the job's ConfigMap, `$(DISTTRAIN_TF_CLUSTER)` expanded by the kubelet (builders/tensorflow.py)."""
    found = await bench.core.read_namespaced_pod(pod, ns)
    env = {e.name: e for e in found.spec.containers[0].env or []}
    value = env["TF_CONFIG"].value
    if (source := env.get(CLUSTER_ENV)) is not None:
        ref = source.value_from.config_map_key_ref
        cluster = (await bench.core.read_namespaced_config_map(ref.name, ns)).data[ref.key]
        value = value.replace(f"$({CLUSTER_ENV})", cluster)
    return sum(len(members) for members in json.loads(value)["cluster"].values())


async def _checkpoint_fan_out(bench: Any, ns: str, name: str) -> dict[str, Any]:
    """suspend: true, then how long until every pod that hears checkpoints has the request; then the
    plain client's baseline: the same pods annotated by it, as many patches in flight as the operator's
    bound on writes (80), each response left unread as the operator leaves it (no model built)."""
    keys = [(ns, pod) for pod in bench.timeline.pods_of_job[(ns, name)] if (ns, pod) in bench.timeline.hears_checkpoint]
    asked = time.monotonic()
    await bench.custom.patch_namespaced_custom_object("disttrain.dev", "v1", ns, "disttrainjobs", name,
                                                      {"spec": {"runPolicy": {"suspend": True}}},
                                                      _content_type="application/merge-patch+json")
    await until(lambda: all((k, CHECKPOINT_REQUEST) in bench.timeline.annotated for k in keys), 120,
                f"checkpoint requests in {ns}")
    times = [bench.timeline.annotated[(k, CHECKPOINT_REQUEST)] for k in keys]
    out = {"checkpoint_pods": len(keys), "checkpoint_first_s": min(times, default=asked) - asked,
           "checkpoint_fan_out_s": max(times, default=asked) - asked}

    def poke(pod: str) -> Any:
        async def go() -> None:
            body = {"metadata": {"annotations": {PLAIN_POKE: "1"}}}
            resp = await bench.admin.call_api(f"/api/v1/namespaces/{ns}/pods/{pod}", "PATCH", body=body,
                                              header_params={"Content-Type": "application/merge-patch+json"},
                                              auth_settings=["BearerToken"], _preload_content=False)
            resp.release()
        return go
    poked = time.monotonic()
    await gather_limited(80, [poke(pod) for _, pod in keys])
    await until(lambda: all((k, PLAIN_POKE) in bench.timeline.annotated for k in keys), 120, f"plain pokes in {ns}")
    out["plain_fan_out_s"] = max(bench.timeline.annotated[(k, PLAIN_POKE)] for k in keys) - poked
    return out


async def large(bench: Any, workers: int) -> dict[str, Any]:
    bench.timeline.watch_annotations = (CHECKPOINT_REQUEST, PLAIN_POKE)
    return {shape: await one(bench, shape, workers) for shape in ("tensorflow", "mpi")}


def target_rows(large: dict[str, Any] | None) -> list[tuple[str, str, str, bool | None]]:
    """bench/results.md's rows against issue 45's goals: the checkpoint request within 2 s of the stop,
    and status writes one per pass at most while the pods are made (64 a pass, and a few more passes)."""
    if not large:
        return []
    rows: list[tuple[str, str, str, bool | None]] = []
    for shape, r in large.items():
        judged = r["workers"] >= LARGE_WORKERS
        rows.append((f"checkpoint request, {r['workers']:,}-worker {shape} job: suspend -> on all its pods", "<= 2 s",
                     f"{r['checkpoint_fan_out_s']:.2f} s ({r['checkpoint_pods']:,} pods; the plain client "
                     f"annotating them: {r['plain_fan_out_s']:.2f} s)",
                     r["checkpoint_fan_out_s"] <= 2.0 if judged else None))
        bound = r["pods"] // 64 + 10
        rows.append((f"status writes while its {r['pods']:,} pods are made ({shape})", f"<= {bound} (a pass's one)",
                     f"{r['status_writes']}", r["status_writes"] <= bound))
    return rows


def section(large: dict[str, Any] | None) -> list[str]:
    if not large:
        return []
    def row(shape: str, r: dict[str, Any]) -> str:
        hostfile = f"{r['apply_to_hostfile_s']:.2f}" if "apply_to_hostfile_s" in r else "-"
        members = f" ({r['tf_config_members']:,} in TF_CONFIG)" if "tf_config_members" in r else ""
        return (f"| {shape} | {r['pods']:,}{members} | {r['apply_to_first_pod_s']:.2f} | {hostfile} | "
                f"{r['apply_to_all_pods_s']:.1f} | {r['apply_to_all_running_s']:.1f} | {r['status_writes']} | "
                f"{r['operator_cpu_s']:.1f} | {r['checkpoint_first_s']:.2f} / {r['checkpoint_fan_out_s']:.2f} "
                f"({r['checkpoint_pods']:,} pods) | {r['plain_fan_out_s']:.2f} |")

    return [
        "", "## Large jobs", "",
        "One job of each shape on the KWOK nodes (hack/bench_large.py): TensorFlow (workers only, gang-scheduled "
        "by the Workload API) and MPI over SSH (a launcher and the workers).", "",
        "| shape | pods | apply -> first pod (s) | apply -> hostfile (s) | apply -> all pods (s) | -> all Running (s) "
        "| status writes | operator CPU (s) | checkpoint request: first / last pod (s) | plain client annotating "
        "the same pods (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(row(shape, r) for shape, r in large.items()),
    ]
