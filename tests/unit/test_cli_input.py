"""`disttrain render` on what a new user feeds it (issue 43): each bad input is one line naming the
file and the field, with a non-zero exit, never a traceback; a `kind: List` is rendered item by item."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from disttrain.__main__ import main
from manifests import gloo_job, mwms_job, with_field


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["render", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def job_text(job: dict[str, Any]) -> str:
    return yaml.safe_dump(job, sort_keys=False)


TF = mwms_job("mw", workers=2)
GLOO = gloo_job("hvd", workers=2)

BAD_FILES: dict[str, tuple[bytes | None, str]] = {
    # name: (the file's content, None for no file; what the one line must name besides the file)
    "missing": (None, "No such file"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "UTF-8"),
    "syntax": (b"apiVersion: disttrain.dev/v1\nkind: DistTrainJob\nspec: [\n", "line"),
    "replicas-two": (job_text(with_field(TF, "spec.tensorflow.worker.replicas", "two")).encode(),
                     "spec.tensorflow.worker.replicas"),
    "restart-sometimes": (job_text(with_field(TF, "spec.tensorflow.worker.restartPolicy", "Sometimes")).encode(),
                          "spec.tensorflow.worker.restartPolicy"),
    "bootstrap-ssh": (job_text(with_field(GLOO, "spec.mpi.bootstrap", "ssh")).encode(), "spec.mpi.bootstrap"),
    "spec-x": (job_text(with_field(TF, "spec", "x")).encode(), "spec"),
    "template-x": (job_text(with_field(TF, "spec.tensorflow.worker.template", "x")).encode(),
                   "spec.tensorflow.worker.template"),
    "empty": (b"", "DistTrainJob"),
    "list": (b"- a\n- b\n", "DistTrainJob"),
    "tfjob": (b"apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: mnist}\nspec: {tfReplicaSpecs: {}}\n",
              "TFJob"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_input_is_one_line_naming_the_file(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content, named = BAD_FILES[case]
    path = tmp_path / f"{case}.yaml"
    if content is not None:
        path.write_bytes(content)
    rc, out, err = run(capsys, str(path))
    assert rc != 0 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"{path}: ") and named in err, err


def test_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, str(tmp_path))
    assert rc != 0 and out == "" and len(err.splitlines()) == 1 and err.startswith(f"{tmp_path}: "), err


def test_a_list_as_kubectl_prints_it_is_rendered_item_by_item(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    one, two = tmp_path / "one.yaml", tmp_path / "list.yaml"
    one.write_text(job_text(TF) + "---\n" + job_text(GLOO))
    two.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
                                   "items": [TF, GLOO]}, sort_keys=False))
    rc_one, separately, _ = run(capsys, str(one))
    rc, listed, err = run(capsys, str(two))
    assert (rc_one, rc, err) == (0, 0, "") and listed == separately and "kind: Pod" in listed


def test_an_unquoted_date_is_a_string_as_kubectl_reads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PyYAML reads `2020-01-01` as a date, which the schema check refused as no string."""
    job = yaml.safe_load(job_text(TF))
    job["spec"]["tensorflow"]["worker"]["template"]["spec"]["containers"][0]["env"] = [{"name": "D", "value": "DATE"}]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job).replace("DATE", "2020-01-01"))
    rc, out, err = run(capsys, str(path))
    assert rc == 0 and "2020-01-01" in out, err


def test_a_job_of_a_version_the_crd_doesnt_serve_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kubectl apply` finds no disttrain.dev/v1beta1 (nor a job with no apiVersion): render said nothing."""
    for version in ("disttrain.dev/v1beta1", None):
        job = yaml.safe_load(job_text(TF))
        job["apiVersion"] = version
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(job))
        rc, _, err = run(capsys, str(path))
        assert rc == 1 and f"apiVersion {version!r}: the CRD serves disttrain.dev/v1" in err, err


def test_rendered_objects_repeat_what_they_share_instead_of_yaml_anchors(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    job = yaml.safe_load(job_text(TF))
    job["spec"]["runPolicy"] = {"networkPolicy": {"egress": "PeersAndDNS"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    rc, out, err = run(capsys, str(path))
    assert rc == 0 and "&id" not in out and "*id" not in out, err
