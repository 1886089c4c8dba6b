"""`make test`'s suite in lanes that run at once, each a pytest session with its own local plane.

Alone, the suite kept this machine's two cores about half busy (a fresh clone's run, sampled every
10 s: 55% over its 40 minutes): most of it waits on pods, the API server and Kueue's timers. Two
sessions side by side fill the other half. A lane is one pytest process: its own plane (state in
.cache/test-cluster-<lane>), its own operator, its own share of the loopback ports and its own
pytest temp folder. Only one lane has the real node: a machine holds one (its bridge, its registry's
fixed address).

    hack/testlanes.py [pytest args ...]     (make test: PYTEST_ARGS)

Each lane's lines come out as they are written, prefixed with the lane's name, and its whole output
is kept in .cache/test-logs/<lane>.log. Exit status: 0 when every lane passed, else the first
failing lane's. `--junitxml=FILE` writes FILE with the lane's name before its suffix
(`report.xml` -> `report.node.xml`, `report.kwok.xml`).
"""

from __future__ import annotations

import contextlib
import os
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


@dataclass(frozen=True)
class Lane:
    name: str
    paths: tuple[str, ...]
    real_node: bool
    ports: str  # DISTTRAIN_PORTS: a share of the range below the kernel's ephemeral ports (not the kubelet's 10250)
    gang_schedulers: bool = True  # Volcano's and scheduler-plugins' on its plane
    nice: int = 0  # its processes' niceness, its plane's included: the lane with time to spare yields
    ignore: tuple[str, ...] = ()  # files under its paths that another lane runs


# Balanced by a fresh clone's times (issue 45). The node lane runs the e2e tests (17 min alone, 19 in a
# lane), and before them the unit tests (2 min) and the packaging test (1 min), which need no plane.
# Meanwhile the other runs the integration (19 min) and quick chaos tests (3 min) on KWOK nodes. Before
# this split the KWOK lane held the unit and packaging tests too and ended 5.3 min after the node lane
# (24.5 against 19.2). `make test` builds the images before either starts. The node lane is the busier
# (TensorFlow in its pods); the KWOK lane mostly waits on its plane's timers, so it runs at niceness 5:
# it takes what the node lane leaves, and a quarter of the cores at least when both want them all. The
# RBAC audit runs in both: it compares each plane's operator requests with the chart's grants.
LANES = (
    Lane("node", ("tests/unit", "tests/integration/test_packaging.py", "tests/e2e",
                  "tests/integration/test_rbac_audit.py"), real_node=True, ports="11000-21000", gang_schedulers=False),
    Lane("kwok", ("tests/integration", "tests/chaos"), real_node=False, ports="21000-32000", nice=5,
         ignore=("tests/integration/test_packaging.py",)),
)


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
        self.log.close()
        self.seconds = time.monotonic() - self.started  # its own end: main() waits for the lanes in turn

    def wait(self) -> int:
        code = self.proc.wait()
        self.copier.join()
        return code


def main(argv: list[str]) -> int:
    width = max(len(lane.name) for lane in LANES)
    running: list[Running] = []
    signals = 0

    def stop(signum: int, _frame: object) -> None:
        """CI's timeout or ^C: SIGINT to each lane's whole process group, and its pytest tears its
        plane down; a second signal kills the groups."""
        nonlocal signals
        signals += 1
        for run in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGINT if signals == 1 else signal.SIGKILL)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    running.extend(Running(lane, argv, width) for lane in LANES)
    codes = [run.wait() for run in running]
    print("\nlanes:")
    for run, code in zip(running, codes, strict=True):
        summary = next((line.strip("= ") for line in reversed(run.last) if " in " in line), "no summary")
        print(f"  {run.lane.name:<{width}}  exit {code}  {run.seconds / 60:5.1f} min  {summary}  "
              f"(whole log: {LOGS.relative_to(ROOT) / run.lane.name}.log)")
    return overall(codes)


def overall(codes: list[int]) -> int:
    """make test's exit status from the lanes'. pytest's 5 is "no tests collected": a lane left empty by
    a -k or -m of PYTEST_ARGS is not a failure, unless every lane is."""
    if all(code == 5 for code in codes):
        return 5
    return next((code for code in codes if code not in (0, 5)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
