"""The progress and checkpoint hook in any image (builders/hook.py, disttrain_progress/install.py):
what the pods are given, and what a Python started with it loads, with the image's own
PYTHONPATH, sitecustomize and user site-packages kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import parse_spec
from disttrain.builders import hook
from disttrain.builders.desired import job_pod
from disttrain.builders.progress import ProgressEndpoint
from manifests import gloo_job, mwms_job
from support import ROOT

JOB = JobRef("mnist", "team-a", "uid-1")
IMAGE = "registry.example.com/ml/disttrain/operator:0.2.0"
ENDPOINT = ProgressEndpoint("https://p.disttrain-system.svc:8443", "-----BEGIN CERTIFICATE-----", hook_image=IMAGE)
WORKER_1 = PodKey("worker", 1)


def built(job: dict[str, Any], key: PodKey = WORKER_1, endpoint: ProgressEndpoint | None = ENDPOINT) -> dict[str, Any]:
    return job_pod(JOB, parse_spec(job["spec"]), key, report_to=endpoint)


def test_every_pod_gets_the_hook_from_an_init_container_of_the_operators_image() -> None:
    pod = built(mwms_job(workers=2))  # worker 1: no reporter, yet it hears checkpoint requests
    init = pod["spec"]["initContainers"][-1]
    assert (init["name"], init["image"]) == (hook.INIT_CONTAINER, IMAGE)
    assert init["command"] == ["python", "-m", "disttrain_progress.install", hook.HOOK_DIR]
    security = init["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == 65532 and security["capabilities"] == {"drop": ["ALL"]}
    assert init["resources"]["requests"] == init["resources"]["limits"]  # a Guaranteed pod stays Guaranteed
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == hook.VOLUME)
    assert volume["emptyDir"]["sizeLimit"] == "16Mi"
    for container in pod["spec"]["containers"]:
        assert {"name": hook.VOLUME, "mountPath": hook.HOOK_DIR, "readOnly": True} in container["volumeMounts"]
        assert {"name": "PYTHONUSERBASE", "value": hook.HOOK_DIR} in container["env"]


def test_a_job_opts_out_and_an_operator_without_a_hook_image_injects_nothing() -> None:
    job = mwms_job(workers=2)
    job["spec"]["runPolicy"] = {"injectProgressHook": False}
    assert "initContainers" not in built(job)["spec"]
    assert "initContainers" not in built(mwms_job(workers=2), endpoint=ProgressEndpoint("https://p", "ca"))
    assert "initContainers" not in built(mwms_job(workers=2), endpoint=None)


def test_the_users_init_containers_and_pythonuserbase_are_theirs() -> None:
    job = gloo_job(workers=2)
    template = job["spec"]["mpi"]["worker"]["template"]["spec"]
    template["initContainers"] = [{"name": "fetch-data", "image": "busybox"}]
    template["containers"][0]["env"] = [{"name": "PYTHONUSERBASE", "value": "/home/me/.local"}]
    pod = built(job, PodKey("worker", 0))
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-data", hook.INIT_CONTAINER]
    assert [e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "PYTHONUSERBASE"] == [
        "/home/me/.local"]


def test_the_installers_import_line_is_the_images_own() -> None:
    from disttrain_progress import install

    pth = (ROOT / "operator" / "disttrain_progress" / "disttrain.pth").read_text().splitlines()
    assert pth[1] == install.HOOK_LINE


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    from disttrain_progress import install

    install.install(tmp_path / "hook")
    return tmp_path / "hook"


def python(code: str, env: dict[str, str]) -> str:
    """`code` in this machine's Python outside the tests' virtualenv, which has disttrain installed
    and, made without --system-site-packages, skips the user site (a limit the docs state)."""
    base = getattr(sys, "_base_executable", sys.executable)
    done = subprocess.run([base, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_python_with_the_hook_as_its_user_base_starts_the_hook_in_a_jobs_pod(installed: Path, tmp_path: Path
                                                                               ) -> None:
    """An image with a PYTHONPATH, a sitecustomize and a `pip install --user` of its own keeps all
    three: the hook adds itself beside them."""
    own = tmp_path / "image-path"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins; builtins.IMAGE_SITECUSTOMIZE = True\n")
    home = tmp_path / "home"
    user_site = home / ".local" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "users_package.py").write_text("WHERE = 'user site'\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(own), "PYTHONUSERBASE": str(installed),
           "DISTTRAIN_CHECKPOINT_DIR": str(tmp_path / "checkpoint")}
    out = python("import builtins, sys, users_package; print(getattr(builtins, 'IMAGE_SITECUSTOMIZE', False), "
                 "'disttrain_progress.startup' in sys.modules, sys.modules['disttrain_progress'].__file__, "
                 "users_package.WHERE)", env)
    sitecustomized, started, package, *_ = out.split()
    assert (sitecustomized, started) == ("True", "True"), out
    assert package.startswith(str(installed)), out
    assert out.endswith("user site"), out
    # Outside a job's pod (neither variable), or with DISTTRAIN_KERAS_HOOK=0, nothing starts.
    assert python("import sys; print('disttrain_progress.startup' in sys.modules)",
                  {k: v for k, v in env.items() if k != "DISTTRAIN_CHECKPOINT_DIR"}) == "False"
    assert python("import sys; print('disttrain_progress.startup' in sys.modules)",
                  {**env, "DISTTRAIN_KERAS_HOOK": "0"}) == "False"


def test_an_image_with_its_own_disttrain_progress_keeps_it(installed: Path, tmp_path: Path) -> None:
    """Our images (and any with the package in its site-packages) import their own copy, not the
    operator's: a training image newer or older than the operator keeps the API it was built with."""
    base = getattr(sys, "_base_executable", sys.executable)
    venv = tmp_path / "image"
    subprocess.run([base, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    image_lib = tmp_path / "image-lib"
    (image_lib / "disttrain_progress").mkdir(parents=True)
    (image_lib / "disttrain_progress" / "__init__.py").write_text("WHOSE = 'the image'\n")
    site_packages = next((venv / "lib").glob("python3.*/site-packages"))
    (site_packages / "disttrain.pth").write_text(f"{image_lib}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONUSERBASE": str(installed),
           "DISTTRAIN_CHECKPOINT_DIR": str(tmp_path / "checkpoint")}
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys, disttrain_progress; "
                           "print(disttrain_progress.WHOSE, sys.argv[1] in sys.path)",
                           str(installed / "lib")], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["the", "image", "False"], done.stdout + done.stderr
