"""Every example is accepted by the API server, and `disttrain render` shows its objects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from disttrain.builders.render import UID_PLACEHOLDER
from support import ROOT, Cluster

EXAMPLES = sorted((ROOT / "examples").glob("*/job*.yaml"))


def test_there_are_examples_for_every_shape() -> None:
    names = {p.parent.name for p in EXAMPLES}
    assert names == {"first-job", "multi-worker-mirrored", "parameter-server", "mirrored-single-pod",
                     "tf1-between-graph", "horovod", "horovod-elastic", "horovod-gloo", "horovod-dra"}
    assert {p.name for p in EXAMPLES if p.parent.name in ("multi-worker-mirrored", "horovod")} >= {"job-gpu.yaml"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_passes_server_side_dry_run(crd: Cluster, namespace: str, example: Path) -> None:
    result = crd.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(example))
    assert "disttrainjob.disttrain.dev" in result.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_render_prints_every_object(example: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "disttrain", "render", str(example)], capture_output=True, text=True,
                         check=True).stdout
    objects = list(yaml.safe_load_all(out))
    job = next(d for d in yaml.safe_load_all(example.read_text()) if d["kind"] == "DistTrainJob")
    spec = job["spec"].get("tensorflow") or job["spec"]["mpi"]
    pods = sum(r.get("replicas", 1) for k, r in spec.items() if isinstance(r, dict) and "template" in r)
    assert [o["kind"] for o in objects].count("Pod") == pods
    assert objects[0]["kind"] == "Service"
    if job["spec"].get("mpi", {}).get("bootstrap") == "Gloo":
        assert "ConfigMap" in {o["kind"] for o in objects} and "Secret" not in {o["kind"] for o in objects}
    elif "mpi" in job["spec"]:
        assert {"ConfigMap", "Secret"} <= {o["kind"] for o in objects}
        secret = next(o for o in objects if o["kind"] == "Secret")
        assert "PRIVATE KEY" not in yaml.safe_dump(secret), "render never prints a real key"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_render_output_passes_server_side_dry_run(crd: Cluster, namespace: str, example: Path) -> None:
    """What `disttrain render` prints is a manifest the API server takes as it is (literal blocks
    included): pods, Service, ConfigMap, Secret."""
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    for doc in docs:
        doc.setdefault("metadata", {})["namespace"] = namespace
    out = subprocess.run([sys.executable, "-m", "disttrain", "render", "-"], input=yaml.safe_dump_all(docs),
                         capture_output=True, text=True, check=True).stdout
    if "bootstrap: Gloo" in out:
        assert "disttrain_gloo.py: |" in out
    elif "mpi" in out:
        assert "hostfile: |" in out
    # The SSH Secret's name ends with the job's uid, which render shows as a placeholder.
    result = crd.kubectl("apply", "--dry-run=server", "-f", "-", input=out.replace(UID_PLACEHOLDER, "dry-run"))
    assert "(server dry run)" in result.stdout and "pod/" in result.stdout, result.stdout
