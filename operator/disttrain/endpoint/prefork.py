"""The progress endpoint's first process, forked from the controller once its modules are imported,
before any thread or event loop: it waits for the controller's keeper (watch/progress_supervisor.py)
to start the endpoint, and then becomes it.

Why: an endpoint started by exec imports its own copy of Python's, aiohttp's and kopf's modules, 43 MB
of PSS before it serves anything, beside the controller's own copy (issue 45: 133 MB for the two
processes idle). Forked from a process that holds them, it shares those pages with the controller
copy-on-write; `gc.freeze()` before the fork keeps either collector from writing to them (the
collector's bookkeeping is in each object's header: one pass would copy every page). What stays
apart is what each process writes: its own objects, and the reference counts of what it uses.

Why it becomes the endpoint rather than forking one (as a fork server did until 2026-11): a process
that keeps the image to fork from keeps the original of every page that the controller and the
endpoint have both written since, and each page the controller wrote, shared with the endpoint:
idle on the local plane, 6.8 MB that only the fork server held and 8 MB it shared with the endpoint
(counted page by page from /proc/PID/pagemap; PSS: controller 38 + endpoint 20 + fork server 19 = 77
MB, and 42 + 27 = 69 MB without it). So the image is forked once: an endpoint that ends is started
again by exec (endpoint/__main__.py), at about 40 MB more, which its memory bound and the chart's
limit already allow for.

The endpoint keeps what exec gives it: its own process, memory bound, niceness and link
(endpoint/process.py); the listening socket and the link come over this process's socket
(SCM_RIGHTS) with the start. Where the fork can't be made (threads already running: a fork copies
the locks they hold) or the process is gone (killed: the kernel's OOM killer), the keeper starts the
endpoint by exec: the fork saves memory, and nothing depends on it.

The controller's side of it is endpoint/forked.py. The protocol, one datagram each (SOCK_SEQPACKET keeps them apart):
    keeper -> process  {"memory_mib": N}, with the link's and the listening socket's fds
    process -> keeper  b"started PID" (its own), then it closes its end and serves
The process is the controller's child: the keeper reaps it, and reads its exit code, as an exec'd one's.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import signal
import socket
import sys
import threading
import traceback

from disttrain.endpoint.forked import MAX_MESSAGE, Prefork

# Its name in `ps -o comm`, `top` and /proc/PID/comm (15 bytes at most) while it waits, and once it
# serves: its command line is the controller's, as forked (`ps aux` shows two `disttrain run`).
WAITING_NAME, ENDPOINT_NAME = b"progress-wait", b"progress-endpt"
M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
# The kernel's OOM killer picks the waiting process before the controller (the endpoint sets its own
# 1000) where the container's score is below this: its badness counts the pages it shares, and the
# keeper starts the endpoint by exec without it.
WAITING_OOM_SCORE_ADJ = 500


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


def _raise_oom_score(score: int) -> None:
    """Never lower: a container's processes start at the kubelet's score for its QoS (a Burstable pod's
    is up to 999), and lowering it needs CAP_SYS_RESOURCE, which the chart drops."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/oom_score_adj", "r+b") as adj:
        if int(adj.read()) < score:
            adj.seek(0)
            adj.write(b"%d" % score)


def prefork_endpoint() -> Prefork | None:
    """In the controller, once its modules are imported and before any thread runs: the endpoint's
    first process, waiting, or None where a fork isn't safe (the keeper then execs the endpoint)."""
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
    if pid == 0:  # the endpoint's first process: its one way out is here
        ours.close()
        code = 1
        try:
            code = _serve(theirs)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    theirs.close()
    ours.setblocking(False)
    return Prefork(pid, ours)


def _serve(control: socket.socket) -> int:
    """Until the keeper's start, then as the endpoint: its exit code (0: the controller went before a
    start, or never started the endpoint: a standby that stopped)."""
    _set_name(WAITING_NAME)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C reaches the controller, which closes this
    _raise_oom_score(WAITING_OOM_SCORE_ADJ)
    try:
        message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 2)
        if not message:
            return 0
        settings = json.loads(message)
        memory_mib = int(settings["memory_mib"])
        if len(fds) != 2:
            raise ValueError(f"a start needs the link and the listening socket, got {len(fds)} fds")
        control.send(b"started %d" % os.getpid())
    except (ConnectionError, KeyboardInterrupt):
        return 0  # the controller went first
    return _become_endpoint(fds, memory_mib)


def _become_endpoint(fds: list[int], memory_mib: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    link, listen = _only_fds(fds)  # the start's socket goes too: the keeper has had its answer
    _set_name(ENDPOINT_NAME)
    _limit_arenas(2)
    from disttrain.endpoint.process import main

    try:
        return main(["--link-fd", str(link), "--listen-fd", str(listen), "--memory-mib", str(memory_mib)])
    except SystemExit as exit_:
        return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1


def _only_fds(keep: list[int]) -> tuple[int, int]:
    """The endpoint holds what exec gave it and nothing more (exec's close_fds): stdin on /dev/null,
    stdout and stderr, its link and its listening socket. Not the socket it was started over (the
    keeper closes its end once answered), nor whatever the controller inherited from its own
    parent."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):  # the listing's own fd, closed meanwhile
                os.close(fd)
    return keep[0], keep[1]
