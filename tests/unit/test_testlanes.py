"""make test's lanes (hack/testlanes.py): what each runs, and the exit status they make together."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import testlanes


def test_every_suite_runs_in_a_lane_and_one_lane_has_the_real_node() -> None:
    paths = [path for lane in testlanes.LANES for path in lane.paths]
    for suite in ("tests/unit", "tests/integration", "tests/chaos", "tests/e2e"):
        assert suite in paths
    assert sum(lane.real_node for lane in testlanes.LANES) == 1
    for lane in testlanes.LANES:
        for path in lane.ignore:
            assert any(path in other.paths for other in testlanes.LANES if other is not lane), \
                f"{path}, left out of the {lane.name} lane, runs in no other"
            assert f"--ignore={path}" in testlanes.command(lane, [])


def test_each_lane_has_its_own_ports_plane_and_report() -> None:
    lanes = testlanes.LANES
    shares = sorted(tuple(map(int, lane.ports.split("-"))) for lane in lanes)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(shares)), "port shares overlap"
    assert not any(low <= 10250 < high for low, high in shares), "the kubelet's port is in a share"
    assert len({testlanes.environment(lane)["DISTTRAIN_TEST_CLUSTER_DIR"] for lane in lanes}) == len(lanes)
    reports = {arg for lane in lanes for arg in testlanes.lane_args(lane, ["--junitxml=out/r.xml", "-q"])}
    assert reports == {"-q"} | {f"--junitxml=out/r.{lane.name}.xml" for lane in lanes}


def test_the_exit_status_is_the_first_failure_and_an_empty_lane_is_no_failure() -> None:
    assert testlanes.overall([0, 0]) == 0
    assert testlanes.overall([0, 1]) == 1
    assert testlanes.overall([2, 1]) == 2
    assert testlanes.overall([5, 0]) == 0
    assert testlanes.overall([5, 1]) == 1
    assert testlanes.overall([5, 5]) == 5


def test_a_background_build_is_logged_and_stopped_when_the_lanes_are_done_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testlanes, "LOGS", tmp_path)
    monkeypatch.setenv("MAKEFLAGS", " -j4 --jobserver-auth=3,4")
    done = testlanes.start_background(testlanes.Background("done", ("sh", "-c", 'echo "[$MAKEFLAGS]"'), nice=1))
    done.wait()
    assert testlanes.end_background(done) == "exit 0"
    assert (tmp_path / "done.log").read_text() == "[]\n"  # not the outer make's jobserver
    slow = testlanes.start_background(testlanes.Background("slow", ("sleep", "60"), nice=1))
    assert testlanes.end_background(slow) == "stopped: the lanes were done before it"
    assert slow.returncode is not None


def test_what_one_late_test_needs_is_built_beside_the_lanes_not_before_them() -> None:
    import re

    from support import ROOT

    prerequisites = re.search(r"^TEST_PREREQUISITES := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    for target in ("previous-plane", "prometheus"):
        assert prerequisites is not None and target not in prerequisites.group(1).split()
        assert any(target in build.command for build in testlanes.BACKGROUND)
