"""The two installs (issue 25, packaging): `pip install disttrain` is the client and `disttrain
logs/render`, light enough for a notebook; `pip install 'disttrain[operator]'` adds what `disttrain
run` needs, and is what the operator image installs. Each form is installed from the wheel into a
fresh venv, as a user would (the packages come from the package index, or pip's cache)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

OPERATOR_ONLY = ["kopf", "prometheus_client", "msgspec"]


def sh(*argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel as `make dist` builds it (`python -m build`: the sdist, then the wheel from the
    sdist, so a file the sdist leaves out fails here), from a copy of what the operator image copies
    (the work tree stays clean)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "operator", src / "operator", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    sh(sys.executable, "-m", "build", "--outdir", out, src)
    [built] = out.glob("disttrain-*.whl")
    assert list(out.glob("disttrain-*.tar.gz")), "no sdist"
    return built


def venv(path: Path, requirement: str) -> Path:
    sh(sys.executable, "-m", "venv", path)
    sh(path / "bin" / "pip", "install", "-q", "--disable-pip-version-check", requirement)
    return path / "bin"


def test_the_light_install_is_the_client_logs_and_render(wheel: Path, tmp_path: Path) -> None:
    bin_ = venv(tmp_path / "light", str(wheel))
    installed = sh(bin_ / "python", "-c", "import importlib.util as u, sys; print(','.join(m for m in sys.argv[1:] "
                   "if u.find_spec(m)))", *OPERATOR_ONLY).stdout.strip()
    assert installed == "", f"the light install brought in {installed}"
    sh(bin_ / "python", "-c", "import disttrain.client, disttrain.client.joblogs, disttrain.builders.render")
    proc = sh(bin_ / "disttrain", "render", ROOT / "examples" / "horovod" / "job.yaml")
    rendered = proc.stdout
    assert "not checked against the CRD" not in proc.stderr, "the light install checks a job as the API server would"
    assert "kind: Secret" in rendered and "<a private key made for this job by the operator>" in rendered
    assert "render" in sh(bin_ / "disttrain", "--help").stdout
    run = sh(bin_ / "disttrain", "run", check=False)
    assert run.returncode == 1, run
    assert "disttrain run needs the operator's dependencies" in run.stderr
    assert "[operator]" in run.stderr and "make dist" in run.stderr, "says how to install it from a checkout"


def test_the_operator_install_has_what_disttrain_run_needs(wheel: Path, tmp_path: Path) -> None:
    bin_ = venv(tmp_path / "operator", f"disttrain[operator] @ {wheel.as_uri()}")
    sh(bin_ / "python", "-c", "import disttrain.watch.handlers, disttrain.watch.pod_events, "
       "disttrain.control.ssh_keys, kopf, prometheus_client")
    # The operator's process loads no Kubernetes client library (rest.py, apiserver/client_libraries.py).
    loaded = sh(bin_ / "python", "-c", "from disttrain.apiserver.client_libraries import keep_out as keep; keep(); "
                "import sys, disttrain.watch.handlers; print(sorted({m.split('.')[0] for m in sys.modules "
                "if m.startswith('kubernetes') and sys.modules[m] is not None}))").stdout.strip()
    assert loaded == "[]"
    assert sh(bin_ / "python", "-c", "import kubernetes_asyncio", check=False).returncode == 1
    assert "--progress-port" in sh(bin_ / "disttrain", "run", "--help").stdout
    example = ROOT / "examples" / "multi-worker-mirrored" / "job.yaml"
    assert "kind: Pod" in sh(bin_ / "disttrain", "render", example).stdout
