"""Real TensorFlow accepts the TF_CONFIG the operator writes.

Each pod's TF_CONFIG is read back from the API server; the only change is each `host:port`
mapped to a free loopback port (there is no kubelet here to run the containers), and real
TensorFlow 2.21 processes run with it: MultiWorkerMirroredStrategy workers must end with the
same weights, and a ParameterServerStrategy chief must train through its ps and workers. The
ps and worker servers never exit (server.join()); when the chief finishes, its pod is marked
done and the operator must end the job and delete them. The reporting pods (the chief, worker 0,
the evaluator) report their progress with `disttrain_progress` as in the image: the finished job's
status keeps their last loss.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import tf_configs_on_loopback
from manifests import replica, tf_job
from progress_support import progress_volume
from support import ROOT, Cluster, tf_config, wait_for

TF_PYTHON = ROOT / ".cache" / "tf-venv" / "bin" / "python"
# The examples' own scripts: what users run is what is proven here.
MWMS_SCRIPT = ROOT / "examples" / "multi-worker-mirrored" / "train.py"
PS_SCRIPT = ROOT / "examples" / "parameter-server" / "train.py"
TF1_SCRIPT = ROOT / "examples" / "tf1-between-graph" / "train.py"
pytestmark = [pytest.mark.tensorflow, pytest.mark.usefixtures("operator")]


def loopback_configs(cluster: Cluster, ns: str, job: str, count: int) -> dict[str, dict[str, Any]]:
    pods = wait_for(lambda: (p := cluster.pods(ns, f"disttrain.dev/job-name={job}")) and len(p) == count and p,
                    30, f"{count} pods of {job}")
    return tf_configs_on_loopback({p.metadata.name: tf_config(p) for p in pods})


def apply_example(cluster: Cluster, ns: str, example: str, name: str, pods: int,
                  workdir: Path) -> dict[str, dict[str, Any]]:
    """Apply an example's job.yaml as users do (the job renamed; its claims get volumes, which
    KWOK never mounts), and return its pods' loopback TF_CONFIGs."""
    import realnode

    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / example / "job.yaml").read_text()) if d]
    for claim in (d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"):
        cluster.core.create_persistent_volume(realnode.claim_volume(ns, claim, workdir / "volumes" / claim))
    next(d for d in docs if d["kind"] == "DistTrainJob")["metadata"]["name"] = name
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))
    return loopback_configs(cluster, ns, name, pods)


def start(name: str, config: dict[str, Any], workdir: Path, script: Path, steps: int = 10,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TF_CONFIG": json.dumps(config), "RESULT_FILE": str(workdir / f"{name}.json"),
           "CHECKPOINT_DIR": str(workdir / "ckpt"), "TRAIN_STEPS": str(steps), "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(workdir / f"{name}.log", "wb") as log:
        return subprocess.Popen([str(TF_PYTHON), str(script)], env=env, stdout=log, stderr=subprocess.STDOUT)


def reporting_env(cluster: Cluster, ns: str, pod: str, workdir: Path) -> dict[str, str]:
    """A reporting pod's progress volume (tests/progress_support.py) and `disttrain_progress` on the
    path, as the image has it at /opt/disttrain/lib."""
    lib = workdir / "lib"
    if not lib.exists():
        lib.mkdir()
        (lib / "disttrain_progress").symlink_to(ROOT / "operator" / "disttrain_progress")
    volume = progress_volume(cluster, ns, pod, workdir / "progress" / pod)
    return {"DISTTRAIN_PROGRESS_DIR": str(volume), "PYTHONPATH": str(lib)}


def assert_reported(cluster: Cluster, ns: str, job: str, reporter: str, last_loss: float,
                    percent: int | None = None) -> None:
    """The finished job's status keeps what its reporting pod said last: who, and the loss."""
    progress = wait_for(lambda: (p := cluster.job_status(ns, job).get("progress") or {}).get("metrics") and p,
                        30, f"{reporter}'s report in the status")
    assert progress["reporter"] == reporter and "eta" not in progress, progress
    assert progress["metrics"]["loss"] == pytest.approx(last_loss, rel=1e-6), (progress, last_loss)
    assert percent is None or progress["percent"] == percent, progress


def stop_all(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        p.kill()
        p.wait()


def wait_exit(procs: dict[str, subprocess.Popen[bytes]], names: list[str], workdir: Path, timeout: float) -> None:
    for name in names:
        try:
            code = procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            stop_all(procs)
            logs = "\n".join(f"--- {n}\n{(workdir / f'{n}.log').read_text()[-3000:]}" for n in procs)
            raise AssertionError(f"{name} exited with {code}\n{logs}")


def result(workdir: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((workdir / f"{name}.json").read_text())
    return data


@pytest.fixture(scope="module", autouse=True)
def tensorflow_installed() -> None:
    if not TF_PYTHON.exists():
        pytest.fail(f"{TF_PYTHON} missing: run `make tf-venv` (make test does)")


def test_multi_worker_mirrored_trains_with_our_tf_config(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    configs = apply_example(cluster, namespace, "multi-worker-mirrored", "mwms", 2, tmp_path)
    reporting = {"mwms-worker-0": reporting_env(cluster, namespace, "mwms-worker-0", tmp_path)}
    procs = {name: start(name, config, tmp_path, MWMS_SCRIPT, env=reporting.get(name))
             for name, config in configs.items()}
    wait_exit(procs, sorted(procs), tmp_path, timeout=300)
    w0, w1 = result(tmp_path, "mwms-worker-0"), result(tmp_path, "mwms-worker-1")
    assert w0["weights"] == w1["weights"], "synchronous training: both workers hold the same model"
    assert w0["loss"][-1] < w0["loss"][0], "the model learned"
    for i in range(2):
        cluster.finish_pod(namespace, f"mwms-worker-{i}", 0)
    cluster.wait_phase(namespace, "mwms", "Succeeded")
    assert_reported(cluster, namespace, "mwms", "mwms-worker-0", w0["loss"][-1], percent=100)


def test_parameter_server_trains_with_our_tf_config(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    job = tf_job("pstf", chief=replica(1), ps=replica(1), worker=replica(2), evaluator=replica(1))
    cluster.apply(job, namespace)
    configs = loopback_configs(cluster, namespace, "pstf", 5)
    assert "evaluator" not in configs["pstf-evaluator-0"]["cluster"]
    assert configs["pstf-evaluator-0"]["task"] == {"type": "evaluator", "index": 0}
    # The chief (the coordinator) and the evaluator report their progress, as in the image.
    reporting = {name: reporting_env(cluster, namespace, name, tmp_path)
                 for name in ("pstf-chief-0", "pstf-evaluator-0")}
    procs = {name: start(name, config, tmp_path, PS_SCRIPT, steps=60, env=reporting.get(name))
             for name, config in configs.items()}
    try:
        wait_exit(procs, ["pstf-chief-0", "pstf-evaluator-0"], tmp_path, timeout=300)
        for name in ("pstf-ps-0", "pstf-worker-0", "pstf-worker-1"):
            assert procs[name].poll() is None, f"{name} should still be serving (server.join())"
    finally:
        stop_all(procs)
    chief = result(tmp_path, "pstf-chief-0")
    assert chief["loss"][-1] < chief["untrained_loss"] / 2, "the model learned"
    evaluator = result(tmp_path, "pstf-evaluator-0")
    assert evaluator["weights"] == chief["weights"], "the evaluator read the chief's checkpoint"
    assert evaluator["loss"][0] < evaluator["untrained_loss"] / 2
    # The chief's pod exits 0; ps and workers never do. The operator ends the job and deletes them.
    cluster.finish_pod(namespace, "pstf-chief-0", 0)
    cluster.wait_phase(namespace, "pstf", "Succeeded")
    wait_for(lambda: [p.metadata.name for p in cluster.pods(namespace, "disttrain.dev/job-name=pstf")
                      if p.metadata.deletion_timestamp is None] == ["pstf-chief-0"], 30, "ps and workers deleted")
    progress = wait_for(lambda: (p := cluster.job_status(namespace, "pstf").get("progress") or {}).get("evaluation")
                        and p, 30, "the chief's and the evaluator's reports in the status")
    assert (progress["reporter"], progress["epoch"], progress["totalEpochs"], progress["percent"]) == (
        "pstf-chief-0", 2, 2, 100), progress
    assert progress["metrics"]["loss"] == pytest.approx(chief["loss"][-1]), (progress, chief["loss"])
    evaluation = progress["evaluation"]
    assert evaluation["reporter"] == "pstf-evaluator-0", progress
    assert evaluation["metrics"]["loss"] == pytest.approx(evaluator["loss"][0]), (evaluation, evaluator["loss"])


def test_tf1_between_graph_trains_with_our_tf_config(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    configs = apply_example(cluster, namespace, "tf1-between-graph", "tf1", 3, tmp_path)
    # Two asynchronous workers share the steps: enough that worker 0 gets several of its own.
    reporting = {"tf1-worker-0": reporting_env(cluster, namespace, "tf1-worker-0", tmp_path)}
    procs = {name: start(name, config, tmp_path, TF1_SCRIPT, steps=100, env=reporting.get(name))
             for name, config in configs.items()}
    try:
        wait_exit(procs, ["tf1-worker-0", "tf1-worker-1"], tmp_path, timeout=300)
        assert procs["tf1-ps-0"].poll() is None, "the ps serves until deleted"
    finally:
        stop_all(procs)
    losses = result(tmp_path, "tf1-worker-0")["loss"]
    assert losses and losses[-1] < losses[0]
    cluster.finish_pod(namespace, "tf1-worker-0", 0)
    cluster.wait_phase(namespace, "tf1", "Succeeded")
    assert_reported(cluster, namespace, "tf1", "tf1-worker-0", losses[-1])
