"""`disttrain logs`, `progress` and `run` when the cluster can't be reached as asked (issue 43): one
line each, never a traceback; `run` checks its numeric flags as the chart's values schema does."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import disttrain
from disttrain.__main__ import main
from fake_apiserver import JSONHandler, serving


class _Forbidden(JSONHandler):
    def do_GET(self) -> None:
        self.send_json(403, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                             "code": 403, "message": 'disttrainjobs.disttrain.dev "mw" is forbidden: User "me" '
                             'cannot get resource "disttrainjobs"'})


@pytest.fixture
def forbidding() -> Iterator[str]:
    with serving(_Forbidden) as url:
        yield url


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}]}))
    return path


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        rc = main(argv)
    except SystemExit as exit_:
        rc = exit_.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert rc not in (0, None) and len(err.strip().splitlines()) == 1, err
    return err


COMMANDS = [["logs", "mw"], ["progress", "mw"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_each_problem_reaching_the_cluster_is_one_line(command: list[str], tmp_path: Path, forbidding: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    malformed = tmp_path / "malformed"
    malformed.write_text("clusters: [\n")
    good = kubeconfig(tmp_path / "good", forbidding)
    assert "kubeconfig" in one_line(capsys, command)
    assert "missing" in one_line(capsys, [*command, "--kubeconfig", str(tmp_path / "missing")])
    assert "malformed" in one_line(capsys, [*command, "--kubeconfig", str(malformed)])
    assert "nowhere" in one_line(capsys, [*command, "--kubeconfig", str(good), "--context", "nowhere"])
    unreachable = kubeconfig(tmp_path / "unreachable", "http://127.0.0.1:1")
    assert "127.0.0.1:1" in one_line(capsys, [*command, "--kubeconfig", str(unreachable)])
    assert "forbidden" in one_line(capsys, [*command, "--kubeconfig", str(good)])


def test_the_operator_says_in_one_line_that_it_cant_reach_the_cluster(tmp_path: Path, forbidding: str) -> None:
    pytest.importorskip("kopf")

    def run(kubeconfig: Path) -> str:  # a process: the operator logs through its own logging setup
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}
        proc = subprocess.run([sys.executable, "-m", "disttrain", "run"], env=env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        return proc.stderr

    assert "kubeconfig" in run(tmp_path / "absent")
    assert "127.0.0.1:1" in run(kubeconfig(tmp_path / "unreachable", "http://127.0.0.1:1"))
    assert "forbidden" in run(kubeconfig(tmp_path / "good", forbidding))


@pytest.mark.parametrize("flag", ["--workers=0", "--progress-status-seconds=-5", "--progress-memory-mib=0",
                                  "--progress-port=70000", "--resync-seconds=0", "--lease-duration=0",
                                  "--resync-seconds=inf", "--progress-status-seconds=inf"])
def test_run_checks_its_numbers_as_the_charts_schema_does(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", flag])
    assert exit_.value.code == 2  # argparse's usage, then its one line naming the flag
    assert f"error: argument {flag.split('=')[0]}: " in capsys.readouterr().err.splitlines()[-1]


def test_help_shows_defaults_and_version_exists(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "(default: 16)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and f"disttrain {disttrain.__version__}" in capsys.readouterr().out
