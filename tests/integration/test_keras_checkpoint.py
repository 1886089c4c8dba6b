"""An unchanged Keras script checkpoints when the operator asks (issue 33), in real TensorFlow:
two MultiWorkerMirroredStrategy workers on loopback run tests/tf_scripts/unchanged_mwms.py with
disttrain_progress's start-up hook (as the images' .pth loads it). A request written to both
workers' checkpoint-request files mid-epoch is saved through the script's own BackupAndRestore at
one step on both; killed then, the fit started again resumes at that step, not at the epoch. The
same for a SIGTERM to one worker alone and no request (a drained pod): both save, and that worker
exits 143 once the checkpoint is made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ports import free_port
from support import ROOT, wait_for

pytestmark = pytest.mark.tensorflow
TF_PYTHON = ROOT / ".cache" / "tf-venv" / "bin" / "python"
SCRIPT = ROOT / "tests" / "tf_scripts" / "unchanged_mwms.py"
# What the images' disttrain.pth does at start-up, for a process of this machine's tf-venv.
HOOKED = "import disttrain_progress.startup, runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], " \
         "run_name='__main__')"


def workers(tmp: Path, run: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
    ports = [free_port(), free_port()]
    started = []
    for index in range(2):
        log = tmp / f"{run}-{index}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "operator"), "TF_USE_LEGACY_KERAS": "1",
               "DISTTRAIN_CHECKPOINT_DIR": str(tmp / f"w{index}"), "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_CONFIG": json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                        "task": {"type": "worker", "index": index}})}
        with open(log, "wb") as out:
            started.append((subprocess.Popen([str(TF_PYTHON), "-c", HOOKED, str(SCRIPT), str(tmp / "backup")],
                                             env=env, stdout=out, stderr=subprocess.STDOUT), log))
    return started


def latest(tmp: Path) -> str:
    """The checkpoint a fit started now would restore: CheckpointManager names it in its state file
    only once the save is whole. (A new ckpt-N.index is not enough: the clean-clone run of 9da4602
    killed the workers between that file and the state file, and the fit resumed at the epoch.)"""
    try:
        return (tmp / "backup" / "chief" / "checkpoint").read_text()
    except FileNotFoundError:
        return ""


def events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]


@pytest.mark.parametrize("asked_by", ["request", "sigterm"])
def test_an_unchanged_script_saves_at_the_asked_step_and_resumes_there(tmp_path: Path, asked_by: str) -> None:
    if not TF_PYTHON.exists():
        pytest.skip("no .cache/tf-venv (make tf-venv)")
    for index in range(2):
        (tmp_path / f"w{index}").mkdir()
        (tmp_path / f"w{index}" / "request").write_text("")
    first = workers(tmp_path, "first")
    try:
        wait_for(lambda: any(e["event"] == "epoch_end" and e["epoch"] >= 1 for e in events(first[0][1])), 120,
                 "two epochs trained")
        saved_before = latest(tmp_path)
        if asked_by == "request":
            for index in range(2):
                (tmp_path / f"w{index}" / "request").write_text("c20261126-120000-000000")
        else:
            first[1][0].send_signal(signal.SIGTERM)
        asked_in = [e["epoch"] for e in events(first[0][1]) if e["event"] == "epoch_end"][-1] + 1
        wait_for(lambda: latest(tmp_path) != saved_before, 20, "the asked checkpoint")
        if asked_by == "sigterm":
            assert first[1][0].wait(20) == 143, "the worker ended by SIGTERM exits once it saved"
            assert first[0][0].poll() is None, "its peer trains on until it is stopped"
    finally:
        for proc, _ in first:
            proc.kill()
            proc.wait()
    ended = [e["epoch"] for e in events(first[0][1]) if e["event"] == "epoch_end"]
    for index in range(2):
        (tmp_path / f"w{index}" / "request").write_text("")
    second = workers(tmp_path, "second")
    try:
        start = wait_for(lambda: next((e for e in events(second[0][1]) if e["event"] == "start"), None), 120,
                         "the fit started again")
    finally:
        for proc, _ in second:
            proc.kill()
            proc.wait()
    print(f"asked in epoch {asked_in}, killed after epoch {max(ended)} ended; resumed at {start}")
    assert start["epoch"] == max(ended) + 1 and start["batch"] > 0, (start, ended, asked_in)
