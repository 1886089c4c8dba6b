"""What one large job may cost the controller (issue 43): its memory and its API requests bounded
before the first create, whatever its replica count, so one namespace's `kubectl apply` can't take
the operator down or hold up another namespace's jobs."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_controller import Harness, run

from disttrain.__main__ import main
from disttrain.api.constants import MAX_REPLICAS
from disttrain.api.objects import JobRef
from disttrain.api.parse import SpecError, parse_spec
from disttrain.builders.tensorflow import tf_config_too_large
from disttrain.decide.reconcile import MAX_PODS_PER_PASS
from manifests import gloo_job, mwms_job

QUOTA = ('pods "mnist-worker-{}" is forbidden: exceeded quota: ten-pods, requested: pods=1, used: pods=10, '
         'limited: pods=10')


def peak_of(scenario: Callable[[], Coroutine[Any, Any, None]]) -> int:
    """The most bytes Python held at once while `scenario` ran."""
    gc.collect()
    tracemalloc.start()
    try:
        run(scenario)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_tensorflow_job_whose_tf_config_cant_be_an_environment_variable_fails_before_any_pod() -> None:
    """5,000 workers: every pod's TF_CONFIG would be 214 kB, past the 128 KiB Linux lets one
    environment variable be. Before: the controller built all 5,000 pods in one pass (over 1 GB:
    the issue saw 57 -> 1,081 MB in 20 s); now the job fails naming the field, and holds no quota. (A
    job stored before the CRD's size rule: `kubectl apply` refuses it now, api/crd_size.py.)"""
    h = Harness(mwms_job("mnist", workers=5000))

    async def scenario() -> None:
        await h.reconcile()

    peak = peak_of(scenario)
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB at the peak"
    assert not h.kube.writes("create")
    status = h.status()
    assert status["phase"] == "Failed" and status["reason"] == "InvalidSpec"
    assert status["message"].startswith("spec.tensorflow.worker.replicas: TF_CONFIG lists all 5000 members")
    assert any(kind == "Warning" and "spec.tensorflow.worker.replicas" in message
               for kind, _, message in h.kube.events)


def test_a_large_job_in_a_small_quota_costs_a_few_creates_a_pass_and_says_the_quota() -> None:
    """A 5,000-worker Gloo job in a namespace whose ResourceQuota allows 10 pods: each pass builds
    at most MAX_PODS_PER_PASS pods and stops creating at the first refusal (batches of 8, 16, 32,
    ..., as Kubernetes' Job controller from 1), and the status says the quota in the API server's words.
    Before: every pass built and tried all 5,000."""
    h = Harness(gloo_job("hvd", workers=5000))
    h.kube.refused.update({f"mnist-worker-{i}": QUOTA.format(i) for i in range(10, 5000)})

    async def scenario() -> None:
        for _ in range(3):
            await h.reconcile()
            h.watch(phase="Pending")
            await h.reconcile()  # within the backoff (the job's own status echo): holds its creates back
            h.clock.advance(301)  # past the refusal's backoff (at most 300 s)

    peak = peak_of(scenario)
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB at the peak"
    creates = [w for w in h.kube.writes("create") if w.startswith("Pod/")]
    # 8, then 16 of which 14 refused; then a refused job's passes start from batches of 1 again,
    # whatever passes came between (a held pass forgot the refusal: 8 again each time, review of 9224fd2).
    assert len(creates) == 8 + 16 + 1 + 1, f"{len(creates)} pod creates in three passes"
    assert len(h.kube.pods()) == 10
    status = h.status()
    assert status["reason"] == "PodCreateRefused" and "exceeded quota: ten-pods" in status["message"], status


def test_one_pass_builds_at_most_max_pods_per_pass_and_comes_back_for_the_rest() -> None:
    h = Harness(gloo_job("hvd", workers=200))

    async def scenario() -> None:
        requeue = await h.reconcile()
        assert len(h.kube.pods()) == MAX_PODS_PER_PASS and requeue is not None and requeue <= 1
        for _ in range(4):
            h.watch(phase="Pending")
            await h.reconcile()
        assert len(h.kube.pods()) == 200

    run(scenario)


@pytest.mark.parametrize("replicas", [-1, MAX_REPLICAS + 1, 100_000])
def test_a_replica_count_past_the_bound_is_refused_as_the_crd_refuses_it(replicas: int) -> None:
    """The CRD's maximum, held by the parser too: a job stored before the CRD said so, and
    `disttrain render` (100,000 workers grew it to 23.5 GB)."""
    manifest = gloo_job("hvd", workers=2)
    manifest["spec"]["mpi"]["worker"]["replicas"] = replicas
    with pytest.raises(SpecError, match=r"^spec\.mpi\.worker\.replicas: .* from 0 to 10000"):
        parse_spec(manifest["spec"])


def test_render_refuses_a_tensorflow_job_too_large_to_start_in_one_line_without_building_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """10,000 workers: each pod's TF_CONFIG would be 340 kB. render building them all took over 300 s
    (the review of issue 43); it said the operator's words at once then, and the CRD's size rule's now
    (api/crd_size.py), as `kubectl apply` would."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(mwms_job("mnist", workers=MAX_REPLICAS)))
    started = time.monotonic()
    assert main(["render", str(path)]) == 1
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f'{path}: DistTrainJob "mnist": spec.tensorflow: Forbidden: too many members: TF_CONFIG lists every'), err


def test_a_tf_config_of_the_users_own_in_every_container_is_not_ours_to_bound() -> None:
    manifest = mwms_job("mnist", workers=5000)
    manifest["spec"]["tensorflow"]["worker"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "TF_CONFIG", "value": '{"task": {"type": "worker", "index": 0}}'}]
    spec = parse_spec(manifest["spec"])
    assert spec.tensorflow is not None
    assert tf_config_too_large(JobRef("mnist", "ml", "u"), spec.tensorflow) is None
    ours = parse_spec(mwms_job("mnist", 5000)["spec"]).tensorflow
    assert ours is not None and tf_config_too_large(JobRef("mnist", "ml", "u"), ours)


def test_an_elastic_jobs_max_replicas_stored_before_the_bound_is_read_as_the_bound() -> None:
    """A running job whose maxReplicas meant "no bound" is not failed by the new operator."""
    manifest = gloo_job("hvd", workers=2)
    manifest["spec"]["mpi"]["elastic"] = {"minReplicas": 1, "maxReplicas": 100_000}
    manifest["spec"]["mpi"].pop("bootstrap")
    manifest["spec"]["mpi"]["launcher"] = {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "l", "image": "x", "command": ["mpirun"]}]}}}
    spec = parse_spec(manifest["spec"])
    assert spec.mpi is not None and spec.mpi.elastic is not None and spec.mpi.elastic.max_replicas == MAX_REPLICAS
