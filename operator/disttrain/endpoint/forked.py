"""The controller's side of the progress endpoint's first process (endpoint/prefork.py): its start,
and the endpoint it becomes as the keeper (watch/progress_supervisor.py) sees it, with what asyncio's
Process has (pid, returncode, wait, terminate, kill). It is forked once: any later endpoint, and
this one where its start fails, is started by exec."""

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
MAX_MESSAGE = 256  # bytes of one datagram, either way: a start's settings, or a pid
START_TIMEOUT = 10.0  # seconds for the process to say it is starting
REAP_POLL = 0.5  # seconds between looks at the process's end, where the kernel has no pidfd
STOP_GRACE = 5.0  # seconds for a process never started to end once its socket is closed, before it is killed


class ForkFailed(Exception):
    """The waiting process didn't start as the endpoint: it is ended, and the keeper's next start
    (after its back-off) is by exec."""


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
    """The endpoint the waiting process became: the controller's own child, reaped here for its exit
    code (CODE as asyncio's returncode: negative for a signal)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    async def wait(self) -> int:
        if self.returncode is None:
            self.returncode = await reap(self.pid)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, number: int) -> None:
        if self.returncode is None:  # once reaped its pid may be another's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)


async def reap(pid: int) -> int:
    """A child's exit code once it ends: woken by its pidfd (Linux 5.3), or looked at every REAP_POLL."""
    waker: asyncio.Event | None = None
    fd = -1
    with contextlib.suppress(OSError, AttributeError):
        fd = os.pidfd_open(pid)
    try:
        if fd >= 0:
            waker = asyncio.Event()
            asyncio.get_running_loop().add_reader(fd, waker.set)
        while True:
            try:
                reaped, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return -signal.SIGKILL  # reaped by another (it can't be: none waits on every child)
            if reaped:
                return os.waitstatus_to_exitcode(status)
            if waker is None:
                await asyncio.sleep(REAP_POLL)
                continue
            waker.clear()
            with contextlib.suppress(TimeoutError):  # a pidfd is readable once its process has ended
                await asyncio.wait_for(waker.wait(), REAP_POLL * 20)
    finally:
        if fd >= 0:
            if waker is not None:
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)


class Prefork:
    """The controller's end of the waiting process: one start, after which it is the endpoint. A
    start that fails ends it (SIGKILL): a late start would otherwise leave an endpoint that nobody
    tracks on the same link and port as the exec'd one that follows."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock = pid, sock
        self.gone = False  # a start tried, or closed: the keeper execs from now on
        self.started = False  # it is the keeper's endpoint: ended and reaped by the keeper
        self.ended = False

    async def start(self, link_fd: int, listen_fd: int, memory_mib: int) -> ForkedProcess:
        if self.gone:
            raise ForkFailed("the waiting process is gone")
        self.gone = True
        loop = asyncio.get_running_loop()
        try:
            socket.send_fds(self.sock, [json.dumps({"memory_mib": memory_mib}).encode()], [link_fd, listen_fd])
            message = await asyncio.wait_for(loop.sock_recv(self.sock, MAX_MESSAGE), START_TIMEOUT)
            word, _, pid = message.partition(b" ")
            if word != b"started" or int(pid) != self.pid:
                raise ForkFailed(f"it answered {message[:64]!r}")
        except (OSError, ValueError, TimeoutError, ForkFailed) as err:
            await self._end()
            raise ForkFailed(f"the waiting process didn't start as the endpoint: {type(err).__name__}: {err}"
                             ) from err
        self.sock.close()
        self.started = True
        return ForkedProcess(self.pid)

    async def close(self) -> None:
        """The controller stops: a process never started ends when its socket closes, and is killed
        if it hasn't within STOP_GRACE (a wedged one would hold the operator's stop); so is one whose
        start was cancelled midway (the keeper stopped while it waited for "started"). One started is
        the keeper's endpoint, ended by it."""
        self.gone = True
        if not self.started:
            await self._end()

    async def _end(self) -> None:
        """Once: its socket closed, then it reaped, killed past STOP_GRACE. Not again after a reap:
        the pid may be another's by then."""
        if self.ended:
            return
        self.sock.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reap(self.pid), STOP_GRACE)
            self.ended = True
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        await reap(self.pid)
        self.ended = True
