"""The progress endpoint's fork server: a process forked from the controller once its modules are
imported, before any thread or event loop, which forks each endpoint process the controller's
keeper asks for (watch/progress_supervisor.py).

Why: an endpoint started by exec imports its own copy of Python's, aiohttp's and kopf's modules, 43 MB
of PSS before it serves anything, beside the controller's own copy (issue 45: 133 MB for the two
processes idle). Forked from a process that holds them, it shares those pages with the controller
copy-on-write; `gc.freeze()` before the fork keeps either collector from writing to them (the
collector's bookkeeping is in each object's header: one pass would copy every page). What stays
apart is what each process writes: its own objects, and the reference counts of what it uses.

The endpoint keeps what exec gave it: its own process, memory bound, niceness and link
(endpoint/process.py); the listening socket and the link come over the fork server's socket
(SCM_RIGHTS) with each start. Where the fork server can't be made (threads already running: a fork
copies the locks they hold) or is gone (killed: the kernel's OOM killer), the keeper starts the
endpoint by exec as before: the fork server saves memory, and nothing depends on it.

The controller's side of it is endpoint/forked.py. The protocol, one datagram each (SOCK_SEQPACKET keeps them apart):
    keeper -> server  {"memory_mib": N}, with the link's and the listening socket's fds
    server -> keeper  b"started PID", then b"exited PID CODE" when that process ends (CODE as
                      asyncio's returncode: negative for a signal)
The server reaps its children itself, so a pid it names is one it started.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import sys
import threading
import traceback

from disttrain.endpoint.forked import MAX_MESSAGE, ForkServer

# Each process's name in `ps -o comm`, `top` and /proc/PID/comm (15 bytes at most): their command
# lines are the controller's, as forked (`ps aux` shows three `disttrain run`).
SERVER_NAME, ENDPOINT_NAME = b"progress-forker", b"progress-endpt"
M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
# The kernel's OOM killer picks the fork server before the controller (the endpoint sets its own 1000):
# its badness counts the pages it shares, and the keeper starts endpoints by exec without it.
SERVER_OOM_SCORE_ADJ = b"500"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)  # the process's own C library: no ldconfig run to find it


def _set_name(name: bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME


def _limit_arenas(count: int) -> None:
    """What MALLOC_ARENA_MAX=2 in the environment does for an exec'd endpoint: glibc reads that
    at start-up, long past in a forked one. Its memory bound counts each arena whole."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().mallopt(M_ARENA_MAX, count)


def start_fork_server() -> ForkServer | None:
    """In the controller, once its modules are imported and before any thread runs: the fork
    server's process, or None where a fork isn't safe (the keeper then execs each endpoint)."""
    if threading.active_count() > 1 or not hasattr(socket, "send_fds"):
        return None
    # The endpoint's own modules too, so that they are among the pages shared.
    import disttrain.endpoint.process  # noqa: F401

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    gc.collect()
    gc.freeze()  # the controller's collector leaves them unwritten too: what it keeps shared
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the fork server
        ours.close()
        code = 1
        try:
            _serve(theirs)
            code = 0
        except (ConnectionError, KeyboardInterrupt):
            code = 0  # the controller went first
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    theirs.close()
    ours.setblocking(False)
    return ForkServer(pid, ours)


def _serve(control: socket.socket) -> None:
    """Until the controller's end closes: fork an endpoint for each start, and say when each ends."""
    _set_name(SERVER_NAME)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C reaches the controller, which closes this
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "wb") as adj:
        adj.write(SERVER_OOM_SCORE_ADJ)
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is wake_read:
                with contextlib.suppress(BlockingIOError):
                    wake_read.recv(4096)
                _reap(control)
                continue
            message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 2)
            if not message:
                return  # the controller is gone; each endpoint goes when its link closes
            try:
                pid = _fork_endpoint(message, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            control.send(b"started %d" % pid)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(b"exited %d %d" % (pid, os.waitstatus_to_exitcode(status)))


def _fork_endpoint(message: bytes, fds: list[int]) -> int:
    settings = json.loads(message)
    memory_mib = int(settings["memory_mib"])
    if len(fds) != 2:
        raise ValueError(f"a start needs the link and the listening socket, got {len(fds)} fds")
    pid = os.fork()
    if pid:
        return pid
    code = 1  # the endpoint, from here on
    try:
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(number, signal.SIG_DFL)
        link, listen = _only_fds(fds)
        _set_name(ENDPOINT_NAME)
        _limit_arenas(2)
        from disttrain.endpoint.process import main

        code = main(["--link-fd", str(link), "--listen-fd", str(listen), "--memory-mib", str(memory_mib)])
    except SystemExit as exit_:
        code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _only_fds(keep: list[int]) -> tuple[int, int]:
    """The endpoint holds what exec gave it and nothing more (exec's close_fds): stdin on /dev/null,
    stdout and stderr, its link and its listening socket. Not the fork server's control socket or
    its selector (an endpoint that pods' bytes took over could have driven the fork server with
    them: registered an always-readable fd in its epoll and spun it), nor whatever the controller
    inherited from its own parent."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):  # the listing's own fd, closed meanwhile
                os.close(fd)
    return keep[0], keep[1]
