"""`disttrain render` prints a manifest a person would write: multi-line values as literal blocks."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import yaml

from disttrain.__main__ import main
from disttrain.api.constants import CHECKPOINT_FILE_LABEL
from disttrain.builders.render import render, render_objects
from manifests import gloo_job, mpi_job, mwms_job


def test_multi_line_values_are_literal_blocks() -> None:
    out = render(yaml.safe_dump(mpi_job("hvd", workers=2, gpus=1)))
    assert "  hostfile: |\n    hvd-worker-0.hvd.default.svc slots=1\n    hvd-worker-1.hvd.default.svc slots=1\n" in out
    assert "  discover_hosts.sh: |\n    #!/bin/sh\n" in out
    assert "  config: |\n    Host *\n" in out
    assert "\n\n" not in out  # no quoted string with a blank line per line break


def test_output_loads_back_to_the_same_objects() -> None:
    for job in (mpi_job("hvd", workers=3, gpus=2), mwms_job("mw", workers=2)):
        assert list(yaml.safe_load_all(render(yaml.safe_dump(job)))) == render_objects(job)


def test_values_a_block_cant_hold_still_load_back() -> None:
    job = mwms_job("mw", workers=1)
    job["spec"]["tensorflow"]["worker"]["template"]["spec"]["containers"][0]["args"] = ["line \nnext\t\n", "x\n"]
    assert list(yaml.safe_load_all(render(yaml.safe_dump(job)))) == render_objects(job)


DRA_FILE = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
spec:
  selectors: [{cel: {expression: 'device.driver == "gpu.example.com"'}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus}
spec:
  spec:
    devices:
      requests: [{name: gpu, exactly: {deviceClassName: gpu.example.com, count: 2}}]
"""


def dra_job(claim: dict[str, str]) -> str:
    job = mpi_job("hvd", workers=2, gpus=0)
    job["spec"]["mpi"]["worker"]["template"]["spec"]["resourceClaims"] = [claim]
    job["spec"]["mpi"]["worker"]["template"]["spec"]["containers"][0]["resources"]["claims"] = [{"name": claim["name"]}]
    return yaml.safe_dump(job)


def test_a_workers_claims_in_the_same_file_give_its_slots_and_each_pod_says_what_it_gets() -> None:
    out = render(DRA_FILE + "---\n" + dra_job({"name": "gpus", "resourceClaimTemplateName": "two-gpus"}),
                 ["gpu.example.com"])
    assert "hvd-worker-0.hvd.default.svc slots=2\n    hvd-worker-1.hvd.default.svc slots=2\n" in out
    assert ("# hvd-worker-1's DRA claims:\n#   gpus: its own ResourceClaim, made from ResourceClaimTemplate two-gpus "
            "(2 of gpu.example.com (GPUs))\n#   so 2 MPI slot(s): one per GPU claimed\n") in out
    assert "kind: ResourceClaimTemplate" not in out, "the user's own objects are not printed"


def test_a_class_not_known_as_gpus_says_how_to_count_it() -> None:
    out = render(DRA_FILE + "---\n" + dra_job({"name": "gpus", "resourceClaimTemplateName": "two-gpus"}))
    assert "slots=1" in out and "slots=2" not in out
    assert "(2 of gpu.example.com (not counted as GPUs: --gpu-device-class gpu.example.com would))\n" in out


def test_a_claim_not_in_the_file_is_said_unknown_and_the_slots_stay_one() -> None:
    out = render(dra_job({"name": "gpus", "resourceClaimTemplateName": "elsewhere"}))
    assert "slots=1" in out and "slots=2" not in out
    assert "ResourceClaimTemplate elsewhere (not in this file: its devices aren't known here)" in out


def test_a_claim_object_of_the_wrong_shape_in_the_file_counts_nothing() -> None:
    broken = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: two-gpus}\nspec: [1]\n"
    out = render(broken + "---\n" + dra_job({"name": "gpus", "resourceClaimTemplateName": "two-gpus"}))
    assert "slots=1" in out and "ResourceClaimTemplate two-gpus (no devices)" in out


def rendered_pods(tmp_path: Path, job: dict[str, Any], *flags: str) -> list[dict[str, Any]]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["render", str(path), *flags]) == 0
    return [o for o in yaml.safe_load_all(out.getvalue()) if o["kind"] == "Pod"]


def env_names(pod: dict[str, Any]) -> set[str]:
    return {e["name"] for c in pod["spec"]["containers"] for e in c.get("env", [])}


def test_pods_are_as_the_charts_operator_makes_them_and_without_progress_on_request(tmp_path: Path) -> None:
    """The chart's default serves the progress endpoint: the pods get what reports and hears a checkpoint."""
    for pods in (rendered_pods(tmp_path, mwms_job("mw", workers=2)), rendered_pods(tmp_path, gloo_job("g"))):
        chief = pods[0]
        assert {"DISTTRAIN_PROGRESS_URL", "DISTTRAIN_CHECKPOINT_DIR"} <= env_names(chief)
        assert {"disttrain-progress", "disttrain-checkpoint"} <= {v["name"] for v in chief["spec"]["volumes"]}
        assert all(p["metadata"]["labels"][CHECKPOINT_FILE_LABEL] == "true" for p in pods)
    for pod in rendered_pods(tmp_path, mwms_job("mw", workers=2), "--no-progress"):
        assert not {"DISTTRAIN_PROGRESS_URL", "DISTTRAIN_CHECKPOINT_DIR"} & env_names(pod)
        assert CHECKPOINT_FILE_LABEL not in pod["metadata"]["labels"]


def test_the_ssh_secrets_name_is_a_placeholder_no_one_takes_for_real(tmp_path: Path) -> None:
    pods = rendered_pods(tmp_path, mpi_job("hvd", workers=2))
    launcher = next(p for p in pods if "launcher" in p["metadata"]["name"])
    secrets = [v["secret"]["secretName"] for v in launcher["spec"]["volumes"] if "secret" in v]
    assert secrets and all("<" in name for name in secrets), secrets
