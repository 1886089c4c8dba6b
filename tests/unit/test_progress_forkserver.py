"""The progress endpoint forked by the fork server (endpoint/forkserver.py), in a process of its own
as the controller's is (the fork server is made before any thread runs, which pytest's process
can't promise): a report reaches the controller's book through a forked endpoint; a killed endpoint
is forked again; a killed fork server leaves the running endpoint serving, and the next endpoint is
started by exec; nothing is left behind. Issue 45: an exec'd endpoint held 43 MB of PSS of modules
the controller also holds."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def test_a_forked_endpoint_serves_is_restarted_and_outlives_its_fork_server(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    probe = (f"import sys; sys.path[:0] = [{str(HERE)!r}]; "
             f"import test_progress_forkserver as t; t.probe({str(tmp_path)!r})")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    print(found)
    assert found["first"]["parent"] == found["server"] and found["first"]["name"] == "progress-endpt", \
        "the endpoint is the fork server's child, named for ps"
    assert found["server_name"] == "progress-forker"
    assert found["shared_sockets"] == [], "the endpoint holds none of the fork server's sockets"
    assert found["restarted"]["parent"] == found["server"], "a killed endpoint is forked again"
    assert found["survived"], "the running endpoint kept serving when its fork server was killed"
    assert found["after"]["exec"], "with the fork server gone, the next endpoint is started by exec"
    assert found["starts"] == 3
    assert found["left"] == [], "no process of the endpoint's left behind"


def test_an_endpoint_that_ends_as_it_starts_is_seen_to_end() -> None:
    """The fork server's "started" and "exited" can come in one read of its socket (an endpoint that
    fails at once while the controller's loop is busy): the keeper's wait() still returns. It
    hung, when the process was tracked only after start() resumed (a review of issue 45's change)."""
    from disttrain.endpoint.forked import ForkServer

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = os.posix_spawn("/bin/sleep", ["sleep", "30"], os.environ)  # stands for the fork server
    theirs.send(b"started 4242")
    theirs.send(b"exited 4242 3")
    ours.setblocking(False)
    forks = ForkServer(server, ours)

    async def main() -> int:
        link, listen = socket.socketpair()
        try:
            process = await forks.start(link.fileno(), listen.fileno(), 384)
            return await asyncio.wait_for(process.wait(), 5)
        finally:
            link.close()
            listen.close()
            os.kill(server, signal.SIGTERM)
            await forks.close()
    assert asyncio.run(main()) == 3
    theirs.close()


def test_no_fork_server_once_a_thread_runs() -> None:
    """A fork copies the locks other threads hold (logging's, the allocator's): where a thread already
    runs, the keeper execs each endpoint instead."""
    from disttrain.endpoint.forkserver import start_fork_server

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert start_fork_server() is None
    finally:
        stop.set()
        thread.join()


def _process(pid: int) -> dict[str, Any]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    rollup = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in
              Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])}
    return {"pid": pid, "parent": int(stat.rsplit(")", 1)[1].split()[1]),
            "name": Path(f"/proc/{pid}/comm").read_text().strip(),
            "exec": "disttrain.endpoint" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"),
            "pss_mb": rollup["Pss"] // 1024,
            "private_mb": (rollup["Private_Clean"] + rollup["Private_Dirty"]) // 1024,
            "data_mb": int(status["VmData"].split()[0]) // 1024}


def _sockets(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:"):
                found.add(target)
    return found


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_descendants(int(child))]
    return found


def probe(tmp: str) -> None:
    """The controller's part, in this process: the fork server first, then the keeper's event loop."""
    from disttrain.apiserver.client_libraries import keep_out

    keep_out()
    from test_progress_process import free_port, pod_token, token_reviews, until_accepted
    from test_progress_server import JOB_UID, Pods, role_of

    from disttrain.control.progress_book import ProgressBook
    from disttrain.control.progress_desk import ProgressDesk
    from disttrain.endpoint.forked import ForkedProcess
    from disttrain.endpoint.forkserver import start_fork_server
    from disttrain.runtime.serving_cert import ServingCert, _certificates
    from disttrain.watch.progress_supervisor import EndpointProcess

    # token_reviews writes it later; a forked endpoint sees the environment of the fork
    os.environ["KUBECONFIG"] = str(Path(tmp) / "kubeconfig")
    forks = start_fork_server()
    assert forks is not None, "no thread runs yet: the fork server is made"
    made = asyncio.run(_certificates(None, ["127.0.0.1", "localhost"], datetime.datetime.now(datetime.UTC)))
    assert made is not None
    cert = ServingCert(made["ca.crt"], made["tls.crt"], made["tls.key"])
    bearer = pod_token("uid-w0")
    found: dict[str, Any] = {"server": forks.pid, "server_name": _process(forks.pid)["name"]}

    async def main() -> None:
        reviews, _ = await token_reviews(Path(tmp))
        book, port = ProgressBook(), free_port()

        async def certificate() -> ServingCert:
            return cert
        endpoint = EndpointProcess(port, ProgressDesk(Pods(), book, role_of), certificate, host="127.0.0.1",
                                   forks=forks)
        endpoint.start()
        try:
            await until_accepted(port, cert.ca, bearer)
            assert book.state(("ml", "mnist"), JOB_UID) is not None, "the report reached the controller's book"
            assert isinstance(endpoint.process, ForkedProcess)
            found["first"] = _process(endpoint.process.pid)
            found["shared_sockets"] = sorted(_sockets(endpoint.process.pid) & _sockets(forks.pid))
            os.kill(endpoint.process.pid, signal.SIGKILL)
            await _until_started(endpoint, 2)
            await until_accepted(port, cert.ca, bearer)
            assert endpoint.process is not None
            found["restarted"] = _process(endpoint.process.pid)
            found["server_process"] = _process(forks.pid)
            found["controller_forking"] = _process(os.getpid())
            os.kill(forks.pid, signal.SIGKILL)
            await asyncio.sleep(1.0)
            found["survived"] = await until_accepted(port, cert.ca, bearer, 10) < 10
            os.kill(endpoint.process.pid, signal.SIGKILL)
            await _until_started(endpoint, 3)
            await until_accepted(port, cert.ca, bearer)
            found["after"] = _process(endpoint.process.pid)
            found["controller"] = _process(os.getpid())
            found["starts"] = endpoint.starts
        finally:
            await endpoint.stop()
            await reviews.cleanup()
        await asyncio.sleep(0.5)
        found["left"] = [_process(pid) for pid in _descendants(os.getpid())]
    asyncio.run(main())
    print(json.dumps(found))


async def _until_started(endpoint: Any, starts: int, seconds: float = 30.0) -> None:
    began = time.monotonic()
    while endpoint.starts < starts:
        assert time.monotonic() - began < seconds, f"start {starts} didn't come in {seconds}s"
        await asyncio.sleep(0.1)
