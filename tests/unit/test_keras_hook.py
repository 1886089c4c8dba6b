"""Progress for an unchanged Keras script (issue 33, disttrain_progress/startup.py): once Keras is
imported, each Model.fit gets disttrain_progress's callbacks unless the script passes its own; outside
a DistTrainJob's pod, or turned off, nothing is installed. A stand-in Keras module, so the hook's
import machinery is tested without TensorFlow (tests/e2e runs it in the image)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import disttrain_progress
from disttrain_progress import startup

FAKE_KERAS = """
class Model:
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, **kwargs):
        return list(callbacks or [])

class Sequential(Model):
    pass
"""


class Ours:
    _disttrain_progress = True


@pytest.fixture
def fake_keras(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "tf_keras").mkdir()
    (tmp_path / "tf_keras" / "__init__.py").write_text(FAKE_KERAS)
    sys.path.insert(0, str(tmp_path))
    before = list(sys.meta_path)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.meta_path[:] = before
    sys.modules.pop("tf_keras", None)


def test_fit_gets_the_callbacks_once_keras_is_imported(fake_keras: Path) -> None:
    added: list[Any] = []

    def callbacks(given: Any, model: Any) -> list[Any]:
        if any(isinstance(c, Ours) for c in given):
            return []
        added.append(Ours())
        return [added[-1]]
    sys.meta_path.insert(0, startup.KerasFinder(lambda m: startup.patch_keras(m, callbacks)))
    import tf_keras

    mine = object()
    assert tf_keras.Sequential().fit([1], [2], callbacks=[mine]) == [mine, added[0]], "appended to the script's"
    assert tf_keras.Model().fit([1], [2], 32, 3, 0, [mine]) == [mine, added[1]], "callbacks passed by position"
    assert tf_keras.Model().fit(callbacks=[Ours()])[0].__class__ is Ours and len(added) == 2, "never twice"
    startup.patch_keras(tf_keras)
    assert len(tf_keras.Model().fit()) == 1, "patching again wraps nothing more"


def test_a_callback_factory_that_fails_leaves_fit_alone(fake_keras: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(given: Any, model: Any) -> list[Any]:
        raise RuntimeError("no TensorFlow here")
    sys.meta_path.insert(0, startup.KerasFinder(lambda m: startup.patch_keras(m, broken)))
    import tf_keras

    assert tf_keras.Model().fit(callbacks=["theirs"]) == ["theirs"]
    assert "no progress callbacks added: RuntimeError: no TensorFlow here" in capsys.readouterr().err


@pytest.mark.parametrize(("environ", "hooked"), [
    ({}, False), ({"DISTTRAIN_CHECKPOINT_DIR": "/var/run/disttrain.dev/checkpoint"}, True),
    ({"DISTTRAIN_PROGRESS_DIR": "/p"}, True), ({"DISTTRAIN_PROGRESS_DIR": "/p", "DISTTRAIN_KERAS_HOOK": "0"}, False)])
def test_only_in_a_jobs_pod_and_not_when_turned_off(environ: dict[str, str], hooked: bool) -> None:
    assert startup.wanted(environ) is hooked


@pytest.mark.parametrize(("environ", "imported"), [
    ({}, False), ({"DISTTRAIN_CHECKPOINT_DIR": "/c"}, True),
    ({"DISTTRAIN_CHECKPOINT_DIR": "/c", "DISTTRAIN_KERAS_HOOK": "0"}, False)])
def test_the_images_pth_imports_the_hook_only_in_a_jobs_pod(environ: dict[str, str], imported: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The .pth line runs at every interpreter's start in the images: outside a job's pod it costs
    an environment lookup, not an import of the client."""
    import site

    pth = Path(startup.__file__).parent / "disttrain.pth"
    for name in ("DISTTRAIN_CHECKPOINT_DIR", "DISTTRAIN_PROGRESS_DIR", "DISTTRAIN_KERAS_HOOK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "disttrain_progress.startup")
    before = list(sys.meta_path)
    try:
        site.addpackage(str(pth.parent), pth.name, set())
        assert ("disttrain_progress.startup" in sys.modules) is imported
    finally:
        sys.meta_path[:] = before
        sys.modules["disttrain_progress.startup"] = startup


def test_only_rank_0_of_an_mpi_job_reports() -> None:
    assert disttrain_progress.mpi_rank({"OMPI_COMM_WORLD_RANK": "2"}) == 2
    assert disttrain_progress.mpi_rank({"HOROVOD_RANK": "0"}) == 0
    assert disttrain_progress.mpi_rank({}) is None, "TensorFlow's pods: the volume says who reports"


SIGTERM_SCRIPT = """
import os, signal, sys, time
from disttrain_progress import keras_checkpoint as kc
{own}
on = kc.OnSigterm()
on.install()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print("received", on.received, flush=True)
on.saved_at = time.monotonic()
os.kill(os.getpid(), signal.SIGTERM)  # soon after a save: the process ends at once
time.sleep(2)
print("still here", flush=True)
"""


@pytest.mark.parametrize("own", [False, True])
def test_sigterm_while_a_fit_runs_asks_a_checkpoint_and_ends_the_process_once_saved(own: bool) -> None:
    """A drained pod's only notice is SIGTERM (keras_checkpoint.OnSigterm). A script's own handler
    is kept, and then SIGTERM is the script's to handle."""
    import subprocess

    handler = "signal.signal(signal.SIGTERM, lambda *a: print('the script\\'s own', flush=True))" if own else ""
    done = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT.format(own=handler)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(Path(startup.__file__).parents[1])}, timeout=30)
    if own:
        assert done.returncode == 0 and "received False" in done.stdout and "still here" in done.stdout, done
    else:
        assert done.returncode == 143 and "received True" in done.stdout and "still here" not in done.stdout, done


def test_after_a_save_asked_for_the_fit_waits_for_the_stop_or_its_calling_off(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from disttrain_progress import keras_checkpoint

    monkeypatch.setenv("DISTTRAIN_CHECKPOINT_DIR", str(tmp_path))
    (tmp_path / "request").write_text("c1")
    on = keras_checkpoint.OnSigterm()
    started = time.monotonic()
    on.await_stop("c1")  # not installed (a script's own handler): no wait
    assert time.monotonic() - started < 0.1
    on.install()
    try:
        threading.Timer(0.3, lambda: (tmp_path / "request").write_text("")).start()  # the stop called off
        on.await_stop("c1")
        assert 0.25 < time.monotonic() - started < 2
    finally:
        on.uninstall()
