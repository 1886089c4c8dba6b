"""GPUs through DRA on the real node, from `kubectl apply` (examples/horovod-dra).

The node runs dra-example-driver's kubelet plugin (hack/nodedra.py: eight fake GPUs, handed to a
container as environment by CDI through containerd 2). The example's two Gloo workers each claim 2
devices by a ResourceClaimTemplate; the chart's operator (dra.gpuDeviceClasses names the driver's
class) counts them, gives each worker 2 slots, and the job runs 4 ranks. Each rank reports the
device its local rank takes; the test holds those to what the scheduler allocated: each pod's own
claim (by UID), two devices per pod, four different devices in all, and the job Succeeded. A
worker retried meanwhile (restartPolicy ExitCode) would be a new pod with a new claim, not followed
here: the test would fail naming the claims, and that is a failure of the run worth seeing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from e2e_support import EXAMPLES, Follow, apply_example, finish, running_with
from fakedra import FAKE_GPU_DRIVER
from support import TIMED, Cluster, LogFollower, wait_for

PODS = {"horovod-dra-worker-0", "horovod-dra-worker-1"}
PER_WORKER = 2


def allocated(cluster: Cluster, ns: str, pod: Any) -> tuple[str, set[str]]:
    """The pod's generated ResourceClaim: its UID and the devices allocated to it."""
    name = pod.status.resource_claim_statuses[0].resource_claim_name
    claim = cluster.custom.get_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", name)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["driver"] for r in results} == {FAKE_GPU_DRIVER}, results
    return claim["metadata"]["uid"], {r["device"] for r in results}


def test_claimed_fake_gpus_reach_each_rank_and_the_job_trains(
        cluster: Cluster, job_namespace: str, tmp_path: Path, follow: Follow) -> None:
    started = time.monotonic()
    apply_example(cluster, job_namespace, EXAMPLES / "horovod-dra" / "job.yaml", tmp_path)
    pods = running_with(cluster, job_namespace, "horovod-dra", PODS)
    claims = {p.metadata.name: allocated(cluster, job_namespace, p) for p in pods if p.metadata.name in PODS}
    logs = follow(job_namespace, [p for p in pods if p.metadata.name in PODS])

    reports: dict[str, list[dict[str, Any]]] = {}
    for name, log in logs.items():
        def said_devices(log: LogFollower = log) -> list[dict[str, Any]] | None:
            said = [e for e in log.events() if e.get("event") == "device"]
            return said if len(said) == PER_WORKER else None
        try:
            reports[name] = wait_for(said_devices, 180, f"{name}'s ranks to say their devices", interval=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- {name}'s log:\n" + "\n".join(log.lines)) from None
    status = finish(cluster, job_namespace, "horovod-dra", started, logs,
                    timing="horovod-dra, 2 workers x 2 claimed GPUs")

    assert status.get("claimedGPUsPerWorker") == PER_WORKER, status
    assert "all 2 workers succeeded" in status["message"], status
    for name, events in reports.items():
        uid, devices = claims[name]
        assert {e["claim"] for e in events} == {uid}, (name, events, uid)
        assert {e["device"] for e in events} == devices and len(devices) == PER_WORKER, (name, events, devices)
        assert sorted(e["local_rank"] for e in events) == list(range(PER_WORKER)), events
    ranks = sorted(e["rank"] for events in reports.values() for e in events)
    assert ranks == [0, 1, 2, 3], reports
    assert len({d for _, devices in claims.values() for d in devices}) == 2 * PER_WORKER, claims
    # The job can be Succeeded before the log stream has delivered rank 0's last line.
    done = logs["horovod-dra-worker-0"].wait_event(lambda e: e.get("event") == "done" and e["rank"] == 0,
                                                   "rank 0's last line", 30)
    assert done["size"] == 2 * PER_WORKER, done
    TIMED.append(f"e2e: DRA on the real node: {sorted((n, sorted(d)) for n, (_, d) in claims.items())}")
