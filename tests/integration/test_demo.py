"""`make demo`, the README's first command, as a tested path: the same script, end to end.

It starts a control plane of its own, installs the chart, runs the operator as the chart's
ServiceAccount and trains the MultiWorkerMirrored example with real TensorFlow. Its last screen
must show the job Succeeded and the events that tell the story.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

pytestmark = pytest.mark.tensorflow


def test_demo_trains_the_example_to_succeeded(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "hack" / "demo.py"), "--dir", str(tmp_path / "demo")],
                            capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    last_screen = output[output.rindex("==> kubectl get disttrainjobs -o wide"):]
    row = next(line.split() for line in last_screen.splitlines() if line.startswith("mnist-mwms "))
    assert row[1:4] == ["Succeeded", "0/2", "0"], last_screen
    events = [line.split()[:2] for line in last_screen.splitlines() if line.startswith(("Normal", "Warning"))]
    assert ["Normal", "AllPodsRunning"] in events and ["Normal", "JobSucceeded"] in events, last_screen
    assert not [e for e in events if e[0] == "Warning"], last_screen
    assert "training process exited with 0" in output
