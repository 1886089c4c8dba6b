"""`make test`'s suite in lanes that run at once, each a pytest session with its own local plane.

Alone, the suite kept this machine's two cores about half busy (a fresh clone's run, sampled every 10 s:
55% over its 40 minutes): most of it waits on pods, the API server and Kueue's timers. Two sessions side
by side fill the other half, and a third without a plane (the unit tests) the rest. A lane is one pytest
process: its own plane where its tests ask one (state in .cache/test-cluster-<lane>), its own operator,
its own share of the loopback ports and its own pytest temp folder. Only one lane has the real node: a
machine holds one (its bridge, its registry's fixed address).

    hack/testlanes.py [pytest args ...]     (make test: PYTEST_ARGS)

Each lane's lines come out as they are written, prefixed with the lane's name, and its whole output
is kept in .cache/test-logs/<lane>.log. Exit status: 0 when every lane passed, else the first
failing lane's. `--junitxml=FILE` writes FILE with the lane's name before its suffix
(`report.xml` -> `report.node.xml`, `report.kwok.xml`, `report.unit.xml`). A build only one late test
needs (BACKGROUND) runs beside the lanes, its output in .cache/test-logs/<build>.log.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".cache" / "test-logs"
# pytest's short summary: "FAILED tests/x.py::test_y - AssertionError: ..." (or ERROR, for a fixture's
# failure), never a captured log line ("ERROR    disttrain.x:file.py:3 boom"), which comes before it.
FAILED_LINE = re.compile(r"(FAILED|ERROR) \S+\.py(::|\s|$)")


@dataclass(frozen=True)
class Lane:
    name: str
    paths: tuple[str, ...]
    real_node: bool
    ports: str  # DISTTRAIN_PORTS: a share of the range below the kernel's ephemeral ports (not the kubelet's 10250)
    gang_schedulers: bool = True  # Volcano's and scheduler-plugins' on its plane
    nice: int = 0  # its processes' niceness, its plane's included: the lane with time to spare yields
    ignore: tuple[str, ...] = ()  # files under its paths that another lane runs


# Balanced by a fresh clone's times (issue 45). The node lane runs the e2e tests (22.5 min in a lane);
# the KWOK lane the integration tests (21 min) on KWOK nodes with the gang schedulers and Kueue; the unit
# lane the unit tests (6 min in a lane), the packaging test (1 min), which need no plane, then the quick
# chaos scenarios (3 min), which need one but no gang scheduler. With the chaos scenarios in the KWOK
# lane it ended 1.8 min after the node lane (24.3 against 22.5), the unit lane 16 min before both. The
# node lane is the busier (TensorFlow in its pods); the KWOK lane mostly waits on its plane's timers, so
# it runs at niceness 5. The unit lane keeps niceness 0: some unit tests time what they check (a lease
# given up within two thirds of its duration). The RBAC audit runs in every lane with a plane: it
# compares that plane's operator requests with the chart's grants.
LANES = (
    Lane("node", ("tests/e2e", "tests/integration/test_rbac_audit.py"), real_node=True, ports="11000-21000",
         gang_schedulers=False),
    Lane("kwok", ("tests/integration",), real_node=False, ports="21000-32000", nice=5,
         ignore=("tests/integration/test_packaging.py",)),
    Lane("unit", ("tests/unit", "tests/integration/test_packaging.py", "tests/chaos",
                  "tests/integration/test_rbac_audit.py"), real_node=False, ports="10300-11000",
         gang_schedulers=False),
)


@dataclass(frozen=True)
class Background:
    """A build the lanes start beside them, for a test late in a lane rather than before every test.
    The test waits for it: the build's script holds a lock while it builds, and finds it built after."""

    name: str
    command: tuple[str, ...]
    nice: int


# The previous minor's control plane and Prometheus, each for one test of the KWOK lane
# (tests/integration/test_plane_upgrade.py, test_prometheus_dashboard.py), which runs the same script:
# it waits on this build's lock, then finds it built. Before the lanes, they held both back by their
# 180 s of compiling from a new machine's empty cache; beside them, at niceness 15, they take what the
# lanes leave: 11 minutes of a fresh clone's run. Both tests are marked `late` (they run at the end of
# their session, 20 minutes in), so that pytest's 600 s timeout, which their setup's wait counts
# against, is never what a slow build meets.
BACKGROUND = (Background("late-builds", ("make", "--no-print-directory", "previous-plane", "prometheus"), nice=15),)


def lane_args(lane: Lane, args: list[str]) -> list[str]:
    """The user's pytest args for one lane: a junit report gets the lane's own file."""
    out = []
    for arg in args:
        if arg.startswith("--junitxml="):
            path = Path(arg.split("=", 1)[1])
            suffix = path.suffix or ".xml"
            arg = f"--junitxml={path.with_name(f'{path.stem}.{lane.name}{suffix}')}"
        out.append(arg)
    return out


def command(lane: Lane, args: list[str]) -> list[str]:
    basetemp = Path(tempfile.gettempdir()) / f"disttrain-pytest-{lane.name}"
    pytest = [sys.executable, "-m", "pytest", *lane.paths, *(f"--ignore={path}" for path in lane.ignore),
              f"--basetemp={basetemp}", *lane_args(lane, args)]
    nice = ["nice", "-n", str(lane.nice)] if lane.nice else []
    return [*nice, *pytest]


def environment(lane: Lane) -> dict[str, str]:
    return {**os.environ, "DISTTRAIN_REAL_NODE": "1" if lane.real_node else "0",
            "DISTTRAIN_TEST_CLUSTER_DIR": str(ROOT / ".cache" / f"test-cluster-{lane.name}"),
            "DISTTRAIN_PORTS": lane.ports, "DISTTRAIN_TEST_GANG_SCHEDULERS": "1" if lane.gang_schedulers else "0",
            "PYTHONUNBUFFERED": "1"}


class Running:
    """One lane's pytest, its lines copied to our stdout (prefixed) and to its log."""

    def __init__(self, lane: Lane, args: list[str], width: int) -> None:
        self.lane, self.started = lane, time.monotonic()
        self.prefix = f"[{lane.name:<{width}}] "
        self.last: list[str] = []
        self.failed: list[str] = []  # pytest's short summary lines (FAILED/ERROR), repeated at the very end
        self.seconds = 0.0
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log = open(LOGS / f"{lane.name}.log", "w")  # noqa: SIM115 (closed when the lane ends)
        self.proc = subprocess.Popen(command(lane, args), cwd=ROOT, env=environment(lane), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                                     start_new_session=True)  # a ^C reaches it once, from main(), not twice
        self.copier = threading.Thread(target=self._copy, daemon=True)
        self.copier.start()

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        echo = True
        for line in self.proc.stdout:
            self.log.write(line)
            if echo:
                try:
                    sys.stdout.write(self.prefix + line)
                    sys.stdout.flush()
                except OSError:  # our stdout gone (`make test | head`): keep draining into the log, or the lane blocks
                    echo = False
            self.last = [*self.last, line.rstrip()][-3:]
            if FAILED_LINE.match(line):  # pytest's summary line, not a captured log's "ERROR    name:file.py:3"
                self.failed.append(line.rstrip())
        self.log.close()
        self.seconds = time.monotonic() - self.started  # its own end: main() waits for the lanes in turn

    def wait(self) -> int:
        code = self.proc.wait()
        self.copier.join()
        return code


def main(argv: list[str]) -> int:
    width = max(len(lane.name) for lane in LANES)
    running: list[Running] = []
    builds: list[subprocess.Popen[bytes]] = []
    signals = 0

    def stop(signum: int, _frame: object) -> None:
        """CI's timeout or ^C: SIGINT to each lane's whole process group, and its pytest tears its
        plane down; a second signal kills the groups. The background builds are ended too."""
        nonlocal signals
        signals += 1
        for run in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGINT if signals == 1 else signal.SIGKILL)
        for build in builds:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(build.pid, signal.SIGTERM if signals == 1 else signal.SIGKILL)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    builds = [start_background(build) for build in BACKGROUND]
    running.extend(Running(lane, argv, width) for lane in LANES)
    codes = [run.wait() for run in running]
    print("\nlanes:")
    for run, code in zip(running, codes, strict=True):
        summary = next((line.strip("= ") for line in reversed(run.last) if " in " in line), "no summary")
        print(f"  {run.lane.name:<{width}}  exit {code}  {run.seconds / 60:5.1f} min  {summary}  "
              f"(whole log: {LOGS.relative_to(ROOT) / run.lane.name}.log)")
    for build, proc in zip(BACKGROUND, builds, strict=True):
        print(f"  {build.name}: {end_background(proc)} (its log: {LOGS.relative_to(ROOT) / build.name}.log)")
    print_failures(running)
    return overall(codes)


def print_failures(running: list[Running]) -> None:
    """Which tests failed, last: a CI that keeps only the tail of a 40-minute log (ours keeps ~25 lines)
    showed "1 failed" in the KWOK lane and not which test, with the lane's log gone with its machine."""
    failed = [(run.lane.name, line) for run in running for line in run.failed]
    if failed:
        print("failed:")
    for name, line in failed[:20]:
        print(f"  [{name}] {line[:400]}")
    if len(failed) > 20:
        print(f"  ... and {len(failed) - 20} more in the lanes' logs")


def start_background(build: Background) -> subprocess.Popen[bytes]:
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / f"{build.name}.log", "wb") as log:
        # Not make's jobserver of `make test`: its fds aren't passed on, and a make told of them warns.
        env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        return subprocess.Popen(["nice", "-n", str(build.nice), *build.command], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def end_background(proc: subprocess.Popen[bytes]) -> str:
    """What became of a background build once the lanes are done: ended, or stopped (a -k left out the
    test that waits for it; the next `make test` builds what it hadn't)."""
    code = proc.poll()
    if code is not None:
        return f"exit {code}"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait()
    return "stopped: the lanes were done before it"


def overall(codes: list[int]) -> int:
    """make test's exit status from the lanes'. pytest's 5 is "no tests collected": a lane left empty by
    a -k or -m of PYTEST_ARGS is not a failure, unless every lane is."""
    if all(code == 5 for code in codes):
        return 5
    return next((code for code in codes if code not in (0, 5)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
