"""`disttrain render` checks a job against the CRD it ships, schema and CEL rules, offline, and says
what `kubectl apply` would (issue 43): one line per error, prefixed by the file, and exit 1."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from disttrain.__main__ import main
from disttrain.api.admission import refusals
from manifests import gloo_job, mpi_job, mwms_job, replica, tf_job, with_field

TF = mwms_job("mw", workers=2)


def typo(job: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(job)
    worker = out["spec"]["tensorflow"]["worker"]
    worker["restartPolcy"] = worker.pop("restartPolicy")
    return out


REFUSED = {
    "two-chiefs": (tf_job("tf", chief=replica(2), worker=replica(2)), "spec.tensorflow.chief.replicas"),
    "replicas-negative": (with_field(TF, "spec.tensorflow.worker.replicas", -1),
                          "spec.tensorflow.worker.replicas: Invalid value: -1: "
                          "spec.tensorflow.worker.replicas in body should be greater than or equal to 0"),
    "replicas-fraction": (with_field(TF, "spec.tensorflow.worker.replicas", 1.5), "must be of type integer"),
    "slots-zero": (with_field(mpi_job("hvd", workers=2), "spec.mpi.slotsPerWorker", 0), "spec.mpi.slotsPerWorker"),
    "port": (with_field(TF, "spec.tensorflow.port", 99999), "should be less than or equal to 65535"),
    "grace": (with_field(TF, "spec.runPolicy", {"checkpointGraceSeconds": 9999}),
              "spec.runPolicy.checkpointGraceSeconds"),
    "bad-name": (with_field(TF, "metadata.name", "Bad_Name"), "metadata.name must be a DNS-1035 label"),
    "long-name": (with_field(TF, "metadata.name", "a" * 61), "metadata.name is too long"),
    "typo": (typo(TF), 'unknown field "spec.tensorflow.worker.restartPolcy"'),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_render_says_what_kubectl_apply_would(case: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    job, said = REFUSED[case]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    rc = main(["render", str(path)])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and said in err, err
    assert err and all(line.startswith(f"{path}: ") for line in err.splitlines()), err


def test_the_cel_rules_hold_for_jobs_the_crd_admits() -> None:
    for job in (TF, mpi_job("hvd"), gloo_job("g"), tf_job("tf", chief=replica(1), worker=replica(2))):
        assert refusals(job) == []


def test_the_cel_rules_refuse_what_they_say() -> None:
    gloo_with_launcher = copy.deepcopy(gloo_job("g"))
    gloo_with_launcher["spec"]["mpi"]["launcher"] = mpi_job()["spec"]["mpi"]["launcher"]
    assert refusals(gloo_with_launcher) == [
        "spec.mpi.launcher: Invalid value: \"object\": a job with bootstrap Gloo has no launcher: each worker runs "
        "the training command itself (move the launcher's command to the worker's first container)"]
    no_launcher = copy.deepcopy(mpi_job())
    del no_launcher["spec"]["mpi"]["launcher"]
    assert refusals(no_launcher) == [
        "spec.mpi.launcher: Required value: spec.mpi.launcher is required with bootstrap SSH: it runs mpirun"]


def test_every_example_renders(capsys: pytest.CaptureFixture[str]) -> None:
    for path in sorted(Path(__file__).parents[2].glob("examples/*/*.yaml")):
        assert main(["render", str(path)]) == 0, capsys.readouterr().err
