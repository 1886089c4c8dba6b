"""The progress endpoint's first process (endpoint/prefork.py), in a process of its own as the
controller's is (it is forked before any thread runs, which pytest's process can't promise): it waits,
then becomes the endpoint, the controller's own child; a report reaches the controller's book through
it; killed, it is seen to end with its true code and the next endpoint is started by exec; nothing is
left behind. Issue 45: an exec'd endpoint held 43 MB of PSS of modules the controller also holds, and
a fork server kept to fork each endpoint 8 MB more than forking the first one only."""

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


def test_the_first_endpoint_is_the_forked_process_and_a_restart_is_by_exec(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    probe = (f"import sys; sys.path[:0] = [{str(HERE)!r}]; "
             f"import test_progress_prefork as t; t.probe({str(tmp_path)!r})")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    print(found)
    assert found["waiting"]["name"] == "progress-wait" and found["waiting"]["parent"] == found["controller_pid"]
    assert found["first"]["pid"] == found["prefork"] and found["first"]["name"] == "progress-endpt", \
        "the waiting process became the endpoint, named for ps"
    assert found["first"]["parent"] == found["controller_pid"] and not found["first"]["exec"]
    assert found["waiting_sockets"] and found["kept_sockets"] == [], \
        "the endpoint holds none of the sockets it held waiting (the one it was started over)"
    assert found["first_code"] == -signal.SIGKILL, "its true exit code, reaped by the controller"
    assert found["after"]["exec"] and found["after"]["parent"] == found["controller_pid"], \
        "the next endpoint is started by exec"
    assert found["starts"] == 2
    assert found["left"] == [], "no process of the endpoint's left behind"


def _waiting_process(answer: bytes | None, code: int = 0, linger: float = 0.0) -> tuple[Any, int]:
    """A process standing for the waiting one: it answers a start with `answer` (None: never reads
    it, and ignores SIGTERM), stays `linger` seconds, and exits `code`. Its Prefork, and its pid."""
    from disttrain.endpoint.forked import Prefork

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = os.fork()
    if child == 0:
        ours.close()
        if answer is None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            theirs.recv(256)
            theirs.send(answer.replace(b"PID", b"%d" % os.getpid()))
        time.sleep(linger)
        os._exit(code)
    theirs.close()
    ours.setblocking(False)
    return Prefork(child, ours), child


def test_an_endpoint_that_ends_as_it_starts_is_seen_to_end() -> None:
    """A process that says it started and ends at once (an endpoint that fails at its start while the
    controller's loop is busy): the keeper's wait() returns its code."""
    prefork, _ = _waiting_process(b"started PID", code=3)

    async def main() -> int:
        link, listen = socket.socketpair()
        try:
            process = await prefork.start(link.fileno(), listen.fileno(), 384)
            return await asyncio.wait_for(process.wait(), 5)
        finally:
            link.close()
            listen.close()
            await prefork.close()
    assert asyncio.run(main()) == 3
    assert prefork.gone, "the next start is by exec"


def test_a_start_answered_wrong_ends_the_waiting_process() -> None:
    """An answer that isn't "started <its pid>" fails the start (ForkFailed), and the process is
    ended and reaped: none is left running on the link and port the exec'd endpoint will get."""
    from disttrain.endpoint.forked import ForkFailed

    prefork, child = _waiting_process(b"started 1", linger=30)  # until killed

    async def main() -> None:
        link, listen = socket.socketpair()
        try:
            await prefork.start(link.fileno(), listen.fileno(), 384)
        finally:
            link.close()
            listen.close()
    began = time.monotonic()
    with contextlib.suppress(ForkFailed):
        asyncio.run(main())
        raise AssertionError("the start should have failed")
    assert prefork.gone
    assert time.monotonic() - began < 10
    assert not Path(f"/proc/{child}").exists(), "killed and reaped"


def test_a_start_cancelled_midway_still_ends_the_waiting_process() -> None:
    """The keeper stopped while the start waited for "started" (the operator stopping as it leads):
    close() ends and reaps the process, which would otherwise serve on unreaped (a review of issue 45's
    change: close() did nothing once a start had been tried)."""
    prefork, child = _waiting_process(None, linger=60)  # never answers: only a kill ends it

    async def main() -> None:
        link, listen = socket.socketpair()
        try:
            start = asyncio.create_task(prefork.start(link.fileno(), listen.fileno(), 384))
            await asyncio.sleep(0.3)
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
            await prefork.close()
        finally:
            link.close()
            listen.close()
    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 10
    assert prefork.sock.fileno() == -1, "its socket closed"
    assert not Path(f"/proc/{child}").exists(), "killed past the grace, and reaped"


def test_no_prefork_once_a_thread_runs() -> None:
    """A fork copies the locks other threads hold (logging's, the allocator's): where a thread already
    runs, the keeper execs the endpoint instead."""
    from disttrain.endpoint.prefork import prefork_endpoint

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert prefork_endpoint() is None
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
    """The controller's part, in this process: the waiting process first, then the keeper's event loop."""
    from disttrain.apiserver.client_libraries import keep_out

    keep_out()
    from test_progress_process import free_port, pod_token, token_reviews, until_accepted
    from test_progress_server import JOB_UID, Pods, role_of

    from disttrain.control.progress_book import ProgressBook
    from disttrain.control.progress_desk import ProgressDesk
    from disttrain.endpoint.forked import ForkedProcess
    from disttrain.endpoint.prefork import prefork_endpoint
    from disttrain.runtime.serving_cert import ServingCert, _certificates
    from disttrain.watch.progress_supervisor import EndpointProcess

    # token_reviews writes it later; a forked endpoint sees the environment of the fork
    os.environ["KUBECONFIG"] = str(Path(tmp) / "kubeconfig")
    prefork = prefork_endpoint()
    assert prefork is not None, "no thread runs yet: the endpoint's first process is forked"
    made = asyncio.run(_certificates(None, ["127.0.0.1", "localhost"], datetime.datetime.now(datetime.UTC)))
    assert made is not None
    cert = ServingCert(made["ca.crt"], made["tls.crt"], made["tls.key"])
    bearer = pod_token("uid-w0")
    found: dict[str, Any] = {"prefork": prefork.pid, "controller_pid": os.getpid(), "waiting": _process(prefork.pid),
                             "waiting_sockets": sorted(_sockets(prefork.pid))}

    async def main() -> None:
        reviews, _ = await token_reviews(Path(tmp))
        book, port = ProgressBook(), free_port()

        async def certificate() -> ServingCert:
            return cert
        endpoint = EndpointProcess(port, ProgressDesk(Pods(), book, role_of), certificate, host="127.0.0.1",
                                   prefork=prefork)
        endpoint.start()
        try:
            await until_accepted(port, cert.ca, bearer)
            assert book.state(("ml", "mnist"), JOB_UID) is not None, "the report reached the controller's book"
            first = endpoint.process
            assert isinstance(first, ForkedProcess)
            found["first"] = _process(first.pid)
            found["kept_sockets"] = sorted(_sockets(first.pid) & set(found["waiting_sockets"]))
            os.kill(first.pid, signal.SIGKILL)
            await _until_started(endpoint, 2)
            found["first_code"] = first.returncode
            await until_accepted(port, cert.ca, bearer)
            assert endpoint.process is not None
            found["after"] = _process(endpoint.process.pid)
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
