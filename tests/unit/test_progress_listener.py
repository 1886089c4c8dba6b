"""The progress endpoint's listener at its bounds, with TLS (issue 43, item 3): what an eviction
does to the newcomer it made room for, and how fast one address may open connections."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from test_progress_hardening import self_signed_context
from test_progress_server import URL, Pods, Reviewer, role_of

from disttrain.control.progress_book import ProgressBook
from disttrain.control.progress_desk import ProgressDesk
from disttrain.endpoint import listener as progress_listener
from disttrain.endpoint.listener import Listener, bind
from disttrain.endpoint.server import ProgressServer


async def tls_endpoint(context: Any) -> tuple[Listener, web.AppRunner, int]:
    server = ProgressServer(Reviewer(), ProgressDesk(Pods(), ProgressBook(), role_of))
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    listener = Listener(runner.server, context)  # type: ignore[arg-type]
    return listener, runner, await listener.start(bind("127.0.0.1", 0))


CLIENT = """
import pathlib, signal, socket, ssl, sys
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
pathlib.Path(sys.argv[3] + ".ready").touch()
signal.sigwait([signal.SIGUSR1])
try:
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=3, source_address=(sys.argv[1], 0))
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    tls = context.wrap_socket(sock)
    head = "POST %s HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\n" % sys.argv[4]
    tls.sendall(head.encode() + b"{}")
    said = tls.recv(64).split()[1].decode()
except Exception as err:
    said = repr(err)
pathlib.Path(sys.argv[3]).write_text(said)
"""


def client(source: str, port: int, answer: Path) -> subprocess.Popen[bytes]:
    """A pod's client: a process of its own, which POSTs a report without a token on SIGUSR1 and
    writes the answer's status (or its error) to `answer`. Started ahead and without pipes: a client
    in the endpoint's process, or pipes to one, would take or free fds, and the fd an eviction frees
    must be the next one accepted."""
    return subprocess.Popen([sys.executable, "-c", CLIENT, source, str(port), str(answer), URL],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


async def post(client: subprocess.Popen[bytes], answer: Path) -> tuple[str, float]:
    """The answer, and how long it took."""
    while not Path(f"{answer}.ready").exists():  # its interpreter started and waiting
        await asyncio.sleep(0.05)
    started = time.monotonic()
    client.send_signal(signal.SIGUSR1)
    await asyncio.to_thread(client.wait, 10)
    return answer.read_text(), time.monotonic() - started


def test_evicting_a_connection_mid_handshake_leaves_the_newcomer_served(monkeypatch: Any, tmp_path: Path) -> None:
    """Every connection held, mid-handshake, by one address; another's arrives and the oldest of the
    first is evicted for it. Its raw socket was closed under a live transport: the stale fd stayed
    in the selector, and the newcomer, given that fd, hung for the handshake's 5 s, then was reset."""
    monkeypatch.setattr(progress_listener, "MAX_CONNECTIONS", 4)
    context = self_signed_context()

    async def main() -> None:
        listener, runner, port = await tls_endpoint(context)
        answers = [tmp_path / f"answer-{n}" for n in range(3)]
        clients = [client("127.0.0.3", port, answer) for answer in answers]
        # The process's lower fds taken, as under load: an fd an eviction frees is the next one given.
        taken = [os.open(os.devnull, os.O_RDONLY) for _ in range(64)]
        held = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) for _ in range(4)]
        try:
            await asyncio.sleep(0.2)
            assert len(listener.open) == 4
            for n, each in enumerate(clients):  # the first's eviction frees an fd: the next accepted gets it
                said, seconds = await post(each, answers[n])
                assert said == "401" and seconds < 1.5, f"connection {n}: {said} after {seconds:.1f}s"
            assert listener.evicted >= 1
        finally:
            for sock in held:
                sock.close()
            for fd in taken:
                os.close(fd)
            for each in clients:  # those a failure left waiting for their signal
                each.kill()
                each.wait()
            await listener.stop()
            await runner.cleanup()
    asyncio.run(main())


def test_connections_from_one_address_past_its_accept_rate_are_closed_before_a_handshake(monkeypatch: Any) -> None:
    """Each TLS handshake costs the endpoint ~0.6 ms of CPU, and any labelled pod could open them as
    fast as it liked (1,700 a second throttled reconciling, which shares the container's CPU limit).
    Past ACCEPT_BURST (then ACCEPTS_PER_SECOND) from one address a connection is closed at once."""
    monkeypatch.setattr(progress_listener, "ACCEPT_BURST", 3.0)
    context = self_signed_context()

    async def main() -> None:
        listener, runner, port = await tls_endpoint(context)
        listener.clock = lambda: 1000.0  # no refill
        try:
            opened = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) for _ in range(8)]
            other = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0))
            await asyncio.sleep(0.3)
            assert (len(listener.open), listener.refused) == (4, 5), "3 from .2, then refused; .3's its own"
            for sock in [*opened, other]:
                sock.close()
        finally:
            await listener.stop()
            await runner.cleanup()
    asyncio.run(main())
