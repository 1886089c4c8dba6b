"""`make bench`: the operator's write path against a plain client doing the same API writes.

On a fresh local control plane (KWOK nodes), in one run:

1. latency: `create DistTrainJob` -> all pods of a 5-pod ParameterServer job exist, with the operator
   running; against a plain client that creates the same Service and 5 pods and writes one status.
2. throughput: J jobs of 5 pods created at once -> all J*5 pods exist; against the plain client
   creating the same objects with the same concurrency.

Results (medians and the ratio operator/plain) go to bench-results/results.md. Ratios, not
seconds, are what to compare across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config, watch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hack"))
sys.path.insert(0, str(REPO / "operator"))
from disttrain.desired import job_pod, supporting_objects  # noqa: E402
from disttrain.objects import JobRef  # noqa: E402
from disttrain.pods import desired_pod_keys  # noqa: E402
from disttrain.spec import parse_spec  # noqa: E402
from localcluster import LocalCluster  # noqa: E402

RESULTS = REPO / "bench-results" / "results.md"


def job_manifest(name: str) -> dict[str, Any]:
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "ExitCode",
                "template": {"spec": {"containers": [{"name": "tf", "image": "tf",
                                                      "resources": {"limits": {"cpu": "1"}}}]}}}
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name},
            "spec": {"tensorflow": {"chief": replica(1), "ps": replica(1), "worker": replica(3)}}}


async def wait_pods(core: Any, ns: str, count: int, timeout: float = 600) -> float:
    """Seconds (monotonic clock) when `count` pods exist in `ns`. A watch can end early (the
    server closes it, or the client's read times out): then list again and watch on."""
    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    while time.monotonic() < deadline:
        listed = await core.list_namespaced_pod(ns)
        seen |= {p.metadata.name for p in listed.items}
        if len(seen) >= count:
            return time.monotonic()
        w = watch.Watch()
        async with w.stream(core.list_namespaced_pod, ns, resource_version=listed.metadata.resource_version,
                            timeout_seconds=60) as stream:
            async for event in stream:
                if event["type"] == "ADDED":
                    seen.add(event["object"].metadata.name)
                    if len(seen) >= count:
                        return time.monotonic()
    raise TimeoutError(f"only {len(seen)}/{count} pods in {ns}")


async def fresh_namespace(core: Any, prefix: str, pods: int) -> tuple[str, asyncio.Task[float]]:
    """A new namespace, ready for pods, and a task that returns when `pods` pods exist in it."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    await core.create_namespace({"metadata": {"name": ns}})
    await wait_sa(core, ns)
    waiter = asyncio.create_task(wait_pods(core, ns, pods))
    await asyncio.sleep(0.2)  # the watch is open before the first write
    return ns, waiter


async def operator_run(api: client.ApiClient, jobs: int) -> float:
    # Plain dicts as bodies, as the operator sends them (see kube.py): the clients are Any.
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    ns, waiter = await fresh_namespace(core, "bench-op", jobs * 5)
    start = time.monotonic()
    await asyncio.gather(*(custom.create_namespaced_custom_object("disttrain.dev", "v1", ns, "disttrainjobs",
                                                                  job_manifest(f"job-{i}")) for i in range(jobs)))
    done = await waiter
    await core.delete_namespace(ns)
    return done - start


async def plain_run(api: client.ApiClient, jobs: int, concurrency: int = 32) -> float:
    """The same API writes the operator makes, from a plain client: per job, create the job
    object, its Service and 5 pods, and write its status once."""
    core: Any = client.CoreV1Api(api)
    ns, waiter = await fresh_namespace(core, "bench-plain", jobs * 5)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        # One object create standing for the job, its Service and 5 pods as the operator builds them,
        # and one patch standing for the status write. A ConfigMap stands for the job so the running
        # operator has nothing to do during this half of the run.
        name = f"plain-{i}"
        async with gate:
            created = await core.create_namespaced_config_map(ns, {"metadata": {"name": name}})
        ref = JobRef(name, ns, created.metadata.uid)
        spec = parse_spec(job_manifest(name)["spec"])
        service = supporting_objects(ref, spec, None)[0]
        pods = [job_pod(ref, spec, k) for k in desired_pod_keys(spec)]
        for obj in (service, *pods):
            obj["metadata"].pop("ownerReferences")
        async with gate:
            await core.create_namespaced_service(ns, service)
        async with gate:
            await asyncio.gather(*(core.create_namespaced_pod(ns, p) for p in pods))
        async with gate:
            await core.patch_namespaced_config_map(name, ns, {"data": {"phase": "Pending"}})

    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(jobs)))
    done = await waiter
    await core.delete_namespace(ns)
    return done - start


async def wait_sa(core: Any, ns: str) -> None:
    for _ in range(300):
        if (await core.list_namespaced_service_account(ns)).items:
            return
        await asyncio.sleep(0.1)


async def bench(kubeconfig: Path, rounds: int, jobs: int) -> dict[str, Any]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 64
    async with client.ApiClient(cfg) as api:
        results: dict[str, Any] = {}
        for label, count, n in (("latency (1 job, 5 pods)", 1, rounds), (f"throughput ({jobs} jobs, {jobs * 5} pods)",
                                                                         jobs, max(1, rounds // 3))):
            op, plain = [], []
            for _ in range(n):  # interleaved, so drift in the machine's load hits both alike
                op.append(await operator_run(api, count))
                plain.append(await plain_run(api, count))
            results[label] = {"operator_s": statistics.median(op), "plain_s": statistics.median(plain),
                              "ratio": statistics.median(op) / statistics.median(plain), "runs": n}
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    root = REPO / ".cache" / "bench-cluster"
    with LocalCluster(root=root, nodes=4, gang_schedulers=False, kueue=False) as cluster:
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        kubectl = str(REPO / ".cache" / "bin" / "kubectl")
        crd = str(REPO / "crds" / "disttrainjobs.disttrain.dev.yaml")
        subprocess.run([kubectl, "apply", "--server-side", "-f", crd], env=env, check=True, capture_output=True)
        time.sleep(2)
        log = open(root / "operator.log", "wb")  # noqa: SIM115 - the child writes to it
        operator = subprocess.Popen([sys.executable, "-m", "disttrain", "run"], env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        try:
            time.sleep(3)
            results = asyncio.run(bench(cluster.kubeconfig, args.rounds, args.jobs))
        finally:
            operator.terminate()
            operator.wait(timeout=10)
    RESULTS.parent.mkdir(exist_ok=True)
    lines = ["# disttrain benchmark", "",
             f"Local control plane (KWOK), {os.cpu_count()} CPUs; medians of interleaved runs.",
             "", "| measure | operator (s) | plain client (s) | ratio | runs |", "| --- | --- | --- | --- | --- |"]
    for label, r in results.items():
        lines.append(f"| {label} | {r['operator_s']:.3f} | {r['plain_s']:.3f} | {r['ratio']:.2f}x | {r['runs']} |")
    RESULTS.write_text("\n".join(lines) + "\n\n```json\n" + json.dumps(results, indent=2) + "\n```\n")
    print(RESULTS.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
