"""The controller's side of the progress endpoint's fork server (endpoint/forkserver.py): each
endpoint it forks, as the keeper (watch/progress_supervisor.py) sees it, with what asyncio's
Process has (pid, returncode, wait, terminate, kill); and what the keeper does when the fork server
is gone (killed: its endpoints' ends are then looked at, and the next starts by exec)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from typing import Protocol

log = logging.getLogger("disttrain.progress")
MAX_MESSAGE = 256  # bytes of one datagram, either way: a start's settings or a pid and exit code
START_TIMEOUT = 10.0  # seconds for the server to say it forked
ORPHAN_POLL = 0.5  # seconds between looks at an endpoint whose fork server is gone, or at the server's end
STOP_GRACE = 5.0  # seconds for the fork server to end once its socket is closed, before it is killed


class ForkFailed(Exception):
    """The fork server didn't start an endpoint: that start ends, the fork server with it, and the
    keeper's next start (after its back-off) is by exec."""


class ChildProcess(Protocol):
    """What the keeper needs of an endpoint's process: asyncio's Process has it, and so does a
    ForkedProcess."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class ForkedProcess:
    """An endpoint the fork server started: asyncio Process's pid, returncode, wait, terminate, kill."""

    def __init__(self, pid: int, server: ForkServer) -> None:
        self.pid, self.server = pid, server
        self.returncode: int | None = None
        self._ended = asyncio.Event()

    def ended(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    async def wait(self) -> int:
        while self.returncode is None:
            if not self.server.gone:
                await self._ended.wait()
                continue
            # The fork server is gone, and with it word of this process's end: look at it instead.
            if not _alive(self.pid):
                self.returncode = -signal.SIGKILL  # its true code went with the server
                break
            await asyncio.sleep(ORPHAN_POLL)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, number: int) -> None:
        if self.returncode is None:  # once it has ended its pid may be another's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)


def _alive(pid: int) -> bool:
    """Whether an orphaned endpoint still runs. A container's PID 1 is the controller, which then
    inherits it: reaped here; otherwise a zombie awaiting another's reaping counts as ended."""
    with contextlib.suppress(ChildProcessError):
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped == 0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class ForkServer:
    """The controller's end of the fork server: one start at a time (the keeper runs one endpoint).
    Any start that fails ends the fork server (SIGKILL): a late fork would otherwise leave an
    endpoint that nobody tracks on the same link and port as the exec'd one that follows."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock = pid, sock
        self.gone = False
        self.processes: dict[int, ForkedProcess] = {}
        self._started: asyncio.Future[ForkedProcess] | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self, link_fd: int, listen_fd: int, memory_mib: int) -> ForkedProcess:
        if self.gone:
            raise ForkFailed("the fork server is gone")
        loop = asyncio.get_running_loop()
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name="progress fork server")
        self._started = started = loop.create_future()
        try:
            socket.send_fds(self.sock, [json.dumps({"memory_mib": memory_mib}).encode()], [link_fd, listen_fd])
            return await asyncio.wait_for(started, START_TIMEOUT)
        except (OSError, TimeoutError, ForkFailed) as err:
            await self.close()
            raise ForkFailed(f"the fork server didn't start an endpoint: {type(err).__name__}: {err}") from err
        finally:
            self._started = None

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while message := await loop.sock_recv(self.sock, MAX_MESSAGE):
                word, *numbers = message.split()
                pid = int(numbers[0])
                if word == b"started" and self._started is not None and not self._started.done():
                    # Tracked here, not when start() resumes: its "exited" can come in the same read.
                    self._started.set_result(self.processes.setdefault(pid, ForkedProcess(pid, self)))
                elif word == b"exited" and (process := self.processes.pop(pid, None)) is not None:
                    process.ended(int(numbers[1]))
        except OSError as err:
            log.warning("progress endpoint: the fork server's socket: %s", err)
        finally:
            await self._ended()

    async def _ended(self) -> None:
        self.gone = True
        self.sock.close()
        if self._started is not None and not self._started.done():
            self._started.set_exception(ForkFailed("the fork server ended"))
        for process in self.processes.values():
            process._ended.set()  # its wait() looks at it from now on
        code = await _reap_server(self.pid)
        log.warning("progress endpoint: the fork server ended (exit %s); endpoints start by exec from now on", code)

    async def close(self) -> None:
        """The controller stops, or a start failed: the server ends when its socket closes, and is
        killed if it hasn't within STOP_GRACE (a wedged one would hold the operator's stop)."""
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        elif not self.gone:
            self.gone = True
            self.sock.close()
            await _reap_server(self.pid)


async def _reap_server(pid: int) -> int | None:
    for _ in range(int(STOP_GRACE / ORPHAN_POLL)):
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if reaped:
            return os.waitstatus_to_exitcode(status)
        await asyncio.sleep(ORPHAN_POLL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return None
