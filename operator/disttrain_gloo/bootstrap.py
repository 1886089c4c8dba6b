"""A Horovod worker's start without SSH: what `horovodrun --gloo` does for one host, in its pod.

The operator runs `python3 /etc/mpi/disttrain_gloo.py -- <command>` as the worker's first container
(spec.mpi.bootstrap: Gloo) with the world's shape in the pod's environment: HOROVOD_SIZE,
HOROVOD_LOCAL_SIZE (the worker's slots), HOROVOD_CROSS_RANK (the worker's index), HOROVOD_CROSS_SIZE,
HOROVOD_HOSTNAME, HOROVOD_CONTROLLER/CPU_OPERATIONS=gloo and HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT
(worker 0's DNS name and the rendezvous port). This script then

1. on worker 0, serves Horovod's rendezvous: the key-value store its Gloo contexts meet at
   (GET/PUT/DELETE /<scope>/<key>, the protocol of horovod/runner/http/http_server.py, which
   horovodrun serves from the launcher host), with bounds on what a request may hold;
2. resolves the rendezvous address, and the interface that reaches it (HOROVOD_GLOO_IFACE,
   NCCL_SOCKET_IFNAME), as horovodrun finds the hosts' common interface;
3. waits until every worker has arrived (a key of its own in the store): Gloo's rendezvous gives up
   after HOROVOD_GLOO_TIMEOUT_SECONDS (30 by default), and horovodrun starts every rank at once,
   while pods start seconds apart (an image pulled on one node only);
4. starts one process of the command per slot, with HOROVOD_RANK and HOROVOD_LOCAL_RANK, forwards
   SIGTERM and SIGINT to them, and exits as the first to fail (128+N for a signal N, as a shell
   does), stopping the others; 0 when all succeed;
5. with several slots, relays each rank's output whole lines at a time, each prefixed as horovodrun
   prefixes it (`[3]<stdout>:`): ranks writing to the container's stdout themselves interleaved
   mid-line (Python's print is two writes when unbuffered: the text, then the newline; seen in
   tests/e2e/test_dra_real_node.py as `{...rank 3...}{...rank 2...}` then two newlines). One rank
   writes to the container's stdout directly, as it would alone.

Standard library only, Python 3.8+: it runs in the user's image.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import os
import re
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ARRIVAL_SCOPE = "disttrain_arrival"
# What one request may hold. A Gloo context's rendezvous value is its rank's address for every
# peer, 136 bytes each: 4 MiB is a world of some 30000 ranks.
MAX_VALUE_BYTES = 4 << 20
# A connection is closed this long after it opened, whatever it has sent (a client that trickles
# its request holds a thread and a connection slot until then).
REQUEST_SECONDS = 10.0
# A process still running this long after its peers' end is killed.
STOP_SECONDS = 10.0
POLL_SECONDS = 0.2
SAY_EVERY_SECONDS = 30.0
LINE_BYTES = 64 * 1024  # a longer line is relayed in pieces of this size, each prefixed
RELAY_DRAIN_SECONDS = 5.0  # after the ranks end, for what they wrote last (a child they left may hold the pipe)
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_LENGTH = re.compile(r"[0-9]{1,18}")
_SIOCGIFADDR = 0x8915


def say(message: str) -> None:
    write_all(2, f"disttrain-gloo: {message}\n".encode(errors="replace"))


RELAY_LOCK = threading.Lock()  # one line at a time on the container's stdout and stderr


def write_all(fd: int, data: bytes) -> bool:
    """`data` to `fd` whole, under the relay's lock (os.write may write part of it); False if the
    stream is gone (the container's log pipe closed)."""
    with RELAY_LOCK:
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            return False
    return True


class World:
    """The job's shape as the operator gave it to this worker's pod."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.size = int(environ["HOROVOD_SIZE"])
        self.local_size = int(environ["HOROVOD_LOCAL_SIZE"])
        self.cross_rank = int(environ["HOROVOD_CROSS_RANK"])
        self.cross_size = int(environ["HOROVOD_CROSS_SIZE"])
        self.address = environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
        self.port = int(environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])

    def rank_env(self, local_rank: int) -> dict[str, str]:
        """One process's own variables: ranks are laid out worker by worker, as horovodrun's
        host assignment lays them out over hosts of equal slots."""
        return {"HOROVOD_RANK": str(self.cross_rank * self.local_size + local_rank),
                "HOROVOD_LOCAL_RANK": str(local_rank), "PYTHONUNBUFFERED": "1"}


class Store:
    """The rendezvous's keys, bounded. In each scope a Gloo rank puts two keys, `<rank>` (its
    addresses) and `rank_<rank>` (its hostname), reads every other rank's, passes a barrier, then
    DELETEs `<rank>` (Gloo's connectFullMesh, Horovod's HTTPStore::Finalize). A DELETE finishes
    both of the rank's keys, and a scope is cleared once every rank in it has finished: none still
    awaits a key, and a process may call hvd.init() again after hvd.shutdown() (horovodrun's
    server clears a scope after as many DELETEs as it has ranks)."""

    def __init__(self, size: int) -> None:
        self.lock = threading.Lock()
        self.scopes: dict[str, dict[str, bytes]] = {}
        self.finished: dict[str, set[str]] = {}
        # One hvd.init() fills the global, local and cross scopes and the same three again for
        # process set 0, two keys per rank in each (12 per rank, measured with Horovod 0.28.1),
        # and the arrivals one per worker: room for that and a re-init. A value is a rank's
        # address for each peer, 136 bytes per peer: the total grows with size squared.
        self.max_keys = 32 * size + 64
        self.max_bytes = (16 << 20) + 1024 * size * size
        self.keys = self.bytes = 0

    def get(self, scope: str, key: str) -> bytes | None:
        with self.lock:
            return self.scopes.get(scope, {}).get(key)

    def put(self, scope: str, key: str, value: bytes) -> bool:
        with self.lock:
            keys = self.scopes.setdefault(scope, {})
            old = keys.get(key)
            keys_after = self.keys + (old is None)
            bytes_after = self.bytes + len(value) - len(old or b"")
            if keys_after > self.max_keys or bytes_after > self.max_bytes:
                if not keys:
                    del self.scopes[scope]
                return False
            keys[key], self.keys, self.bytes = value, keys_after, bytes_after
            return True

    def finish(self, scope: str, key: str) -> None:
        with self.lock:
            keys = self.scopes.get(scope)
            if keys is None or key not in keys or not key.isdigit():
                return  # only a rank that has put its key finishes: a DELETE of anything else stores nothing
            done = self.finished.setdefault(scope, set())
            done.add(key)
            if done.issuperset(k for k in keys if k.isdigit()):
                self.keys -= len(keys)
                self.bytes -= sum(len(v) for v in keys.values())
                del self.scopes[scope], self.finished[scope]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server
    timeout = REQUEST_SECONDS

    def _target(self) -> tuple[str, str] | None:
        parts = self.path.split("/")
        if len(parts) == 3 and parts[0] == "" and _NAME.fullmatch(parts[1]) and _NAME.fullmatch(parts[2]):
            return parts[1], parts[2]
        self._answer(400)
        return None

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        target = self._target()
        if target is not None:
            value = self.server.store.get(*target)
            self._answer(404) if value is None else self._answer(200, value)

    def do_PUT(self) -> None:
        target = self._target()
        if target is None:
            return
        length = self.headers.get("Content-Length", "")
        if not _LENGTH.fullmatch(length) or int(length) > MAX_VALUE_BYTES:
            self.close_connection = True
            self._answer(411 if not _LENGTH.fullmatch(length) else 413)
            return
        value = self.rfile.read(int(length))
        if len(value) != int(length):
            self._answer(400)
        elif self.server.store.put(*target, value):
            self._answer(200)
        else:
            self._answer(507)

    def do_DELETE(self) -> None:
        target = self._target()
        if target is not None:
            self.server.store.finish(*target)
            self._answer(200)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """One thread per connection, at most `max_connections` at once: a flood of connections is
    closed unread rather than holding a thread each."""

    daemon_threads = True

    def __init__(self, port: int, store: Store, max_connections: int) -> None:
        self.store = store
        self.slots = threading.BoundedSemaphore(max_connections)
        dual = socket.has_dualstack_ipv6()
        self.address_family = socket.AF_INET6 if dual else socket.AF_INET
        super().__init__(("::" if dual else "0.0.0.0", port), Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        deadline = threading.Timer(REQUEST_SECONDS, _hang_up, (request,))
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self.slots.release()


def _hang_up(request: socket.socket) -> None:
    """A connection past its time: its reads end, its handler returns, its slot is free."""
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


def serve(world: World) -> Server:
    server = Server(world.port, Store(world.size), max_connections=2 * world.size + 32)
    threading.Thread(target=server.serve_forever, name="rendezvous", daemon=True).start()
    say(f"serving the rendezvous on port {world.port} for {world.size} ranks")
    return server


def until(what: Callable[[], str], attempt: Callable[[], Any]) -> Any:
    """Call `attempt` until it returns something other than None, saying what it waits for now and then."""
    said = time.monotonic()
    while (result := attempt()) is None:
        if time.monotonic() - said >= SAY_EVERY_SECONDS:
            say(f"still waiting for {what()}")
            said = time.monotonic()
        time.sleep(0.5)
    return result


def resolve_once(host: str, port: int) -> str | None:
    """An IPv4 address of `host`: Horovod's rendezvous client speaks IPv4 alone (its URL is
    "http://" + address + ":" + port, split at the first colon)."""
    try:
        return str(socket.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)[0][4][0])
    except OSError:
        return None


def interface_of(ip: str) -> str | None:
    """The network interface holding `ip`, or None: Gloo then finds its own by hostname."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(answer[20:24]) == ip:
                return name
    return None


def local_ip_towards(ip: str, port: int) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, port))  # no packet is sent: it picks the route
        return str(probe.getsockname()[0])


# Straight to worker 0, as Horovod's own client goes: never through an http_proxy of the image's
# environment (whose no_proxy can't name the pod network as a CIDR for urllib).
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(method: str, url: str, body: bytes | None = None) -> int:
    """The HTTP status, or 0 when the server can't be reached."""
    try:
        with _DIRECT.open(urllib.request.Request(url, data=body, method=method), timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def arrive(world: World) -> str:
    """Say this worker is here, then wait until every worker has; worker 0's IPv4 address. The
    name is resolved again after each failed try: a restarted worker 0 has a new address."""
    def here() -> str | None:
        ip = resolve_once(world.address, world.port)
        if ip is None or call("PUT", f"http://{ip}:{world.port}/{ARRIVAL_SCOPE}/{world.cross_rank}", b"1") != 200:
            return None
        return ip
    ip = str(until(lambda: f"{world.address} to resolve and its rendezvous to answer", here))
    missing = set(range(world.cross_size))

    def everyone() -> bool | None:
        missing.difference_update({i for i in missing
                                   if call("GET", f"http://{ip}:{world.port}/{ARRIVAL_SCOPE}/{i}") == 200})
        return True if not missing else None
    until(lambda: f"the other workers to start (missing: worker {', '.join(map(str, sorted(missing)))})", everyone)
    return ip


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128+N for a signal N."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class Ranks:
    """The processes of this worker, and the signals it receives. Handlers are set before anything
    else: the bootstrap is the container's PID 1, which the kernel gives no default action, so a
    SIGTERM it had no handler for would be ignored and the pod killed only at its grace's end."""

    def __init__(self) -> None:
        self.processes: dict[int, int] = {}  # pid: local rank
        # Held, never dropped: a Popen dropped while its child runs is polled (and the child reaped)
        # by subprocess's own cleanup, and wait()'s waitpid would never see it end.
        self.popens: list[subprocess.Popen[bytes]] = []
        self.relays: list[threading.Thread] = []
        self.started = False
        self.signalled: int | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if not self.started:
            raise SystemExit(128 + signum)  # nothing to stop but ourselves
        self.signalled = signum
        self._send(signum)

    def _send(self, signum: int) -> None:
        for pid in list(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def start(self, command: Sequence[str], envs: Sequence[Mapping[str, str]]) -> None:
        self.started = True
        relay = len(envs) > 1
        for local_rank, env in enumerate(envs):
            pipe = subprocess.PIPE if relay else None
            proc = subprocess.Popen(command, env=env, stdout=pipe, stderr=pipe)
            self.popens.append(proc)
            self.processes[proc.pid] = local_rank
            for stream, name, fd in ((proc.stdout, "stdout", 1), (proc.stderr, "stderr", 2)):
                if stream is not None:
                    prefix = f"[{env.get('HOROVOD_RANK', local_rank)}]<{name}>:".encode()
                    thread = threading.Thread(target=relay_lines, args=(stream, prefix, fd), daemon=True)
                    thread.start()
                    self.relays.append(thread)
        if self.signalled is not None:  # one came while they started: every rank hears it
            self._send(self.signalled)

    def drain(self) -> None:
        """What the ranks wrote last, relayed before the bootstrap exits."""
        deadline = time.monotonic() + RELAY_DRAIN_SECONDS
        for thread in self.relays:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _cause(self, local_rank: int, status: int) -> tuple[int, int]:
        """The first failure reaped, or a rank killed by a signal found ended with it. waitpid gives
        ranks already ended in no order of their ending: a bootstrap kept off the CPU for 50 ms (a
        busy node) found a rank SIGKILLed (an OOM) and its peer's exit 1 (the collective that lost
        it) both ended, and reaped the exit 1 first. A killed rank is not one that failed of its
        peer's loss: its signal is the cause, and the pod's code (137, retryable)."""
        while self.processes:
            try:
                pid, other = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            rank = self.processes.pop(pid, None)
            if rank is not None and os.WIFSIGNALED(other) and not os.WIFSIGNALED(status):
                local_rank, status = rank, other
        return local_rank, status

    def wait(self) -> int:
        """Until every rank has ended: the first to fail ends the others; 0 when all succeed.
        Any child is reaped, orphans the container's PID 1 inherits included."""
        failed: int | None = None
        deadline: float | None = None
        while self.processes:
            pid, status = os.waitpid(-1, os.WNOHANG if deadline is not None else 0)
            if pid == 0:  # stopping the others: none has ended yet
                assert deadline is not None  # WNOHANG only then
                if time.monotonic() >= deadline:
                    self._send(signal.SIGKILL)
                    deadline = None
                else:
                    time.sleep(POLL_SECONDS)
                continue
            local_rank = self.processes.pop(pid, None)
            if local_rank is None or failed is not None or exit_code(status) == 0:
                continue
            local_rank, status = self._cause(local_rank, status)
            failed = exit_code(status)
            say(f"local rank {local_rank} exited with code {failed}: stopping the other ranks")
            self._send(signal.SIGTERM)
            deadline = time.monotonic() + STOP_SECONDS
        return failed or 0


def relay_lines(stream: Any, prefix: bytes, fd: int) -> None:
    """A rank's stream to our `fd`, a whole line per write, after the rank's prefix. Read to its end
    even once `fd` is gone (what is read then is dropped): a rank must never block on a full pipe."""
    writable = True
    with contextlib.suppress(OSError, ValueError):
        for line in iter(lambda: stream.readline(LINE_BYTES), b""):
            if writable:
                writable = write_all(fd, prefix + line + (b"" if line.endswith(b"\n") else b"\n"))


def rank_environment(world: World, local_rank: int, ip: str, interface: str | None) -> dict[str, str]:
    env = {**os.environ, **world.rank_env(local_rank), "HOROVOD_GLOO_RENDEZVOUS_ADDR": ip}
    if interface is not None and "HOROVOD_GLOO_IFACE" not in os.environ:
        env["HOROVOD_GLOO_IFACE"] = interface
        env.setdefault("NCCL_SOCKET_IFNAME", interface)
    return env


def main(argv: Sequence[str]) -> int:
    command = list(argv[1:] if argv[:1] == ["--"] else argv)
    if not command:
        say("usage: disttrain_gloo.py -- COMMAND [ARGS...]")
        return 2
    ranks = Ranks()
    world = World(os.environ)
    server = serve(world) if world.cross_rank == 0 else None
    ip = arrive(world)
    interface = interface_of(local_ip_towards(ip, world.port))
    say(f"all {world.cross_size} workers here; starting {world.local_size} rank(s) of {command[0]}"
        f" (rendezvous {ip}:{world.port}, interface {interface or 'by hostname'})")
    try:
        ranks.start(command, [rank_environment(world, r, ip, interface) for r in range(world.local_size)])
        code = ranks.wait()
        ranks.drain()
        return code
    finally:
        if server is not None:
            server.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
