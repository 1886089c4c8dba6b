"""A large TensorFlow job's cluster ConfigMap (builders/tensorflow.py) through the controller: made
before the first pod, and made again when a container waits for it after someone deleted it
(decide/supporting_steps.py): the kubelet reads it at every container start, in-place restarts
included, and no pod would be missing for the operator to make."""

from __future__ import annotations

from fakes import FakeKube
from test_controller import RUNNING, Harness, run

from disttrain.builders.tensorflow import cluster_config_map_name
from manifests import mwms_job

WORKERS = 250  # a cluster of ~9 KB: past INLINE_CLUSTER_BYTES


def config_map_writes(kube: FakeKube) -> list[str]:
    return [w for w in kube.writes("create") if w.startswith("ConfigMap/")]


def waiting_for(name: str, kind: str = "configmap") -> dict[str, object]:
    return {"phase": "Pending", "containerStatuses": [{"name": "tensorflow", "restartCount": 0, "state": {
        "waiting": {"reason": "CreateContainerConfigError", "message": f'{kind} "{name}" not found'}}}]}


def test_the_cluster_config_map_comes_before_the_pods_and_once() -> None:
    h = Harness(mwms_job("mnist", workers=WORKERS))
    name = cluster_config_map_name(h.controller_ref())

    async def scenario() -> None:
        for _ in range(WORKERS // 64 + 2):
            await h.reconcile()
            h.watch(**RUNNING)
        creates = h.kube.writes("create")
        assert creates[:2] == ["Service/ml/mnist", f"ConfigMap/ml/{name}"]
        assert config_map_writes(h.kube) == [f"ConfigMap/ml/{name}"]
        assert len(h.kube.pods()) == WORKERS and h.status()["phase"] == "Running"
    run(scenario)


def test_a_deleted_cluster_config_map_a_container_waits_for_is_made_again() -> None:
    h = Harness(mwms_job("mnist", workers=WORKERS, restartPolicy="OnFailure"))
    name = cluster_config_map_name(h.controller_ref())

    async def scenario() -> None:
        for _ in range(WORKERS // 64 + 2):
            await h.reconcile()
            h.watch(**RUNNING)
        made = next(k for k in h.kube.objects if k[0] == "ConfigMap")
        del h.kube.objects[made]  # `kubectl delete configmap`
        h.kube.calls.clear()
        await h.reconcile()  # every container running: nothing asks for it
        assert config_map_writes(h.kube) == []
        h.watch(**waiting_for(name))  # a container (re)started, and its start waits for it
        await h.reconcile()
        assert h.kube.writes("create") == [f"ConfigMap/ml/{name}"]  # that alone: no pod made twice, no Service
        assert made in h.kube.objects
        h.kube.calls.clear()
        await h.reconcile()  # the kubelet's message still stands: made already, found the job's own
        assert h.kube.writes("create") == [f"ConfigMap/ml/{name}"] and h.status()["phase"] != "Failed"
        for other in (waiting_for("someone-elses"), waiting_for(name, kind="secret")):  # not what the operator made
            h.kube.calls.clear()
            h.watch(**other)
            await h.reconcile()
            assert config_map_writes(h.kube) == []
    run(scenario)


QUOTA = ('pods "mnist-worker-{}" is forbidden: exceeded quota: some-pods, requested: pods=1, used: pods=20, '
         "limited: pods=20")


def test_the_config_map_restored_within_a_pod_creates_backoff_keeps_the_refusal() -> None:
    """The review of 9224fd2: restoring the ConfigMap forgot a pod create's refusal, so the next pass
    sent a batch of refused creates again and started the backoff from 5 s (and a Warning event each
    time the kubelet's message stood). The restore says nothing of the quota: the refusal stands."""
    h = Harness(mwms_job("mnist", workers=WORKERS, restartPolicy="OnFailure"))
    h.kube.refused.update({f"mnist-worker-{i}": QUOTA.format(i) for i in range(20, WORKERS)})
    name = cluster_config_map_name(h.controller_ref())

    async def scenario() -> None:
        backoff = await h.reconcile()
        assert h.status()["reason"] == "PodCreateRefused" and backoff is not None
        refused_creates = len([w for w in h.kube.writes("create") if w.startswith("Pod/")])
        made = next(k for k in h.kube.objects if k[0] == "ConfigMap")
        del h.kube.objects[made]
        h.clock.advance(1)
        h.watch(**waiting_for(name))
        await h.reconcile()  # within the backoff: the ConfigMap again, no pod
        assert made in h.kube.objects
        h.clock.advance(1)
        await h.reconcile()  # still within it
        assert len([w for w in h.kube.writes("create") if w.startswith("Pod/")]) == refused_creates
        assert h.status()["reason"] == "PodCreateRefused"
        assert len([e for e in h.kube.events if e[1] == "PodCreateRefused"]) == 1
    run(scenario)
