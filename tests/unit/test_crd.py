"""The generated CRD, checked without a cluster."""

from __future__ import annotations

from typing import Any

from disttrain.api import defaults
from disttrain.api.crd import crd, crd_yaml
from support import CRD_FILE


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, child in (schema.get("properties") or {}).items():
        out += walk(child, f"{path}.{name}")
    return out


def test_committed_crd_is_the_generators_output() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ is stale: run `make crd`"


def test_the_chart_installs_that_crd_and_no_other() -> None:
    charted = sorted((CRD_FILE.parents[1] / "charts" / "disttrain-operator" / "crds").iterdir())
    assert [f.name for f in charted] == [CRD_FILE.name], "the chart's crds/ holds one file: run `make crd`"
    assert charted[0].read_text() == CRD_FILE.read_text(), "the chart's CRD is stale: run `make crd`"


def test_every_field_of_ours_has_a_description() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing = [path for path, node in walk(schema)
               if ".template." not in path + "." and not path.endswith(".metadata") and "description" not in node]
    assert not missing


def test_defaults_come_from_one_place() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["tensorflow"]["properties"]["port"]["default"] == defaults.TF_PORT
    assert spec["runPolicy"]["properties"]["backoffLimit"]["default"] == defaults.BACKOFF_LIMIT
    assert spec["mpi"]["properties"]["launcherStart"]["default"] == defaults.MPI_LAUNCHER_START


def test_pod_templates_have_no_blanket_preserve_unknown_fields() -> None:
    assert "x-kubernetes-preserve-unknown-fields" not in CRD_FILE.read_text()
