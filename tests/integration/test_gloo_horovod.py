"""Real Horovod 0.28.1 over the operator's Gloo bootstrap (spec.mpi.bootstrap Gloo), on this machine.

No Kubernetes: each worker pod's command and environment come from the pure builders (job_pod), the
bootstrap is the ConfigMap's text written to a file, and the two "pods" are two processes here with
worker 0's DNS name replaced by localhost. Horovod's own C++ Gloo client must meet at our rendezvous,
train, and end with the same weights on every rank; and the same training launched by Horovod's own
`horovodrun --gloo` must reach the same loss (our ranks are its ranks).

Needs .cache/hvd-venv (hack/mpi-e2e/build-hvd-venv.sh): TensorFlow 2.15 and Horovod 0.28.1 with Gloo.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import parse_spec
from disttrain.builders import gloo
from disttrain.builders.desired import job_pod, supporting_objects
from manifests import gloo_job
from support import HOROVODRUN_PREFIX

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parents[2]
HVD_PYTHON = ROOT / ".cache" / "hvd-venv" / "bin" / "python"
TRAIN = ROOT / "examples" / "horovod" / "train.py"
REF = JobRef(name="hvd", namespace="ml", uid="uid-1")
# Two TensorFlow ranks on two cores; no GPU here.
QUIET = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
         "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "DISTTRAIN_KERAS_HOOK": "0"}


@pytest.fixture(autouse=True)
def _needs_horovod() -> None:
    if not HVD_PYTHON.exists():
        pytest.skip("no .cache/hvd-venv (make mpi-e2e)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def finals(log: Path) -> list[dict[str, Any]]:
    # A worker of several slots relays its ranks' lines after horovodrun's prefix (`[3]<stdout>:`).
    lines = [json.loads(line) for line in (HOROVODRUN_PREFIX.sub("", each) for each in log.read_text().splitlines())
             if line.startswith("{")]
    return [e for e in lines if e.get("event") == "done"]


def run_job(tmp: Path, workers: int, steps: int) -> list[dict[str, Any]]:
    """Every worker pod of a Gloo job as the operator builds it, run here as a process."""
    spec = parse_spec(gloo_job(workers=workers)["spec"])
    bootstrap = tmp / gloo.BOOTSTRAP
    config = next(o for o in supporting_objects(REF, spec, None) if o["kind"] == "ConfigMap")
    bootstrap.write_text(config["data"][gloo.BOOTSTRAP])
    port, procs = free_port(), []
    for index in range(workers):
        container = job_pod(REF, spec, PodKey("worker", index))["spec"]["containers"][0]
        # A container's environment: its image's (this machine's, as for horovodrun below), then the pod's.
        env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]}, **QUIET,
            "HOME": str(tmp), "CHECKPOINT_DIR": str(tmp / "ckpt"),
            "TRAIN_STEPS": str(steps), "EPOCHS": "2",
            # Here, not in a cluster: worker 0 is this machine, its port a free one.
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "localhost", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port)}
        assert container["command"] == ["python3", f"/etc/mpi/{gloo.BOOTSTRAP}"] and container["args"][0] == "--"
        argv = [str(HVD_PYTHON), str(bootstrap), "--", str(HVD_PYTHON), str(TRAIN)]
        with open(tmp / f"worker-{index}.log", "wb") as log:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(300) for p in procs]
    logs = "".join((tmp / f"worker-{i}.log").read_text()[-3000:] for i in range(workers))
    assert codes == [0] * workers, logs
    return [d for i in range(workers) for d in finals(tmp / f"worker-{i}.log")]


def test_horovod_trains_over_the_bootstrap_as_it_does_under_horovodrun(tmp_path: Path) -> None:
    (tmp_path / "bootstrap").mkdir()
    ours = run_job(tmp_path / "bootstrap", workers=2, steps=40)
    assert sorted(d["rank"] for d in ours) == [0, 1] and {d["size"] for d in ours} == {2}
    assert len({d["weights_sha256"] for d in ours}) == 1, "every rank ends with the same weights"

    theirs_dir = tmp_path / "horovodrun"
    theirs_dir.mkdir()
    env = {**os.environ, **QUIET, "HOME": str(theirs_dir), "CHECKPOINT_DIR": str(theirs_dir / "ckpt"),
           "TRAIN_STEPS": "40", "EPOCHS": "2", "PATH": f"{HVD_PYTHON.parent}:{os.environ['PATH']}"}
    run = subprocess.run([str(HVD_PYTHON.parent / "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2",
                          str(HVD_PYTHON), str(TRAIN)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    theirs = [json.loads(line[line.index("{"):]) for line in run.stdout.splitlines() if '"event": "done"' in line]
    assert {d["weights_sha256"] for d in theirs} == {d["weights_sha256"] for d in ours}
    assert {d["rank"]: d["final_loss"] for d in theirs} == {d["rank"]: d["final_loss"] for d in ours}


def test_the_ranks_are_the_ones_horovods_host_assignment_gives() -> None:
    """horovodrun's get_host_assignments over hosts of equal slots, against builders/gloo.rank_env
    (which a unit test holds to the bootstrap's own)."""
    spec = parse_spec(gloo_job(workers=3, gpus=2)["spec"])
    assert spec.mpi is not None
    code = ("import json; from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts; "
            "print(json.dumps([[s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.size] "
            "for s in get_host_assignments(parse_hosts('hvd-worker-0:2,hvd-worker-1:2,hvd-worker-2:2'), 6)]))")
    slots = json.loads(subprocess.run([str(HVD_PYTHON), "-c", code], capture_output=True, text=True,
                                      check=True).stdout)
    for hostname, rank, local_rank, local_size, cross_rank, cross_size, size in slots:
        pod = job_pod(REF, spec, PodKey("worker", cross_rank))
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["HOROVOD_HOSTNAME"] == hostname and env["HOROVOD_LOCAL_SIZE"] == str(local_size)
        assert env["HOROVOD_CROSS_SIZE"] == str(cross_size) and env["HOROVOD_SIZE"] == str(size)
        assert gloo.rank_env(spec.mpi, cross_rank, local_rank)["HOROVOD_RANK"] == str(rank)
