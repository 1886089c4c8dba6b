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
   does), stopping the others; 0 when all succeed.

Standard library only, Python 3.8+: it runs in the user's image.
"""

from __future__ import annotations

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
# What one request may hold. A Gloo context's rendezvous value is its rank's addresses for every
# peer, tens of bytes per rank: 4 MiB is a world of some 100000 ranks.
MAX_VALUE_BYTES = 4 << 20
# A request not sent in this long is dropped (a client that opens and waits holds a thread).
REQUEST_SECONDS = 10.0
# A process still running this long after its peers' end is killed.
STOP_SECONDS = 10.0
POLL_SECONDS = 0.2
SAY_EVERY_SECONDS = 30.0
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_SIOCGIFADDR = 0x8915


def say(message: str) -> None:
    print(f"disttrain-gloo: {message}", file=sys.stderr, flush=True)


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
    """The rendezvous's keys, bounded: a scope is cleared once every key put in it has been
    DELETEd (each rank DELETEs its own after reading all the others', so none is still awaited),
    which lets a process call hvd.init() again after hvd.shutdown()."""

    def __init__(self, size: int) -> None:
        self.lock = threading.Lock()
        self.scopes: dict[str, dict[str, bytes]] = {}
        self.finished: dict[str, set[str]] = {}
        # Three contexts (global, local, cross) of one key per rank, and the arrivals: what a
        # world of `size` ranks stores, with room to spare; the values' total grows with size².
        self.max_keys = 4 * size + 64
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
            if keys is None:
                return
            done = self.finished.setdefault(scope, set())
            done.add(key)
            if done.issuperset(keys):
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
        if not length.isdigit() or int(length) > MAX_VALUE_BYTES:
            self.close_connection = True
            self._answer(411 if not length.isdigit() else 413)
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
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


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


def resolve(host: str, port: int) -> str:
    def attempt() -> str | None:
        try:
            return str(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0])
        except OSError:
            return None
    return str(until(lambda: f"{host} to resolve", attempt))


def interface_of(ip: str) -> str | None:
    """The network interface holding `ip` (IPv4), or None: Gloo then finds its own by hostname."""
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
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, port))  # no packet is sent: it picks the route
        return str(probe.getsockname()[0])


def call(method: str, url: str, body: bytes | None = None) -> int:
    """The HTTP status, or 0 when the server can't be reached."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method), timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def arrive(world: World, base: str) -> None:
    """Say this worker is here, then wait until every worker has."""
    until(lambda: "the rendezvous on worker 0 to answer",
          lambda: True if call("PUT", f"{base}/{ARRIVAL_SCOPE}/{world.cross_rank}", b"1") == 200 else None)
    missing = set(range(world.cross_size))

    def everyone() -> bool | None:
        missing.difference_update({i for i in missing if call("GET", f"{base}/{ARRIVAL_SCOPE}/{i}") == 200})
        return True if not missing else None
    until(lambda: f"the other workers to start (missing: worker {', '.join(map(str, sorted(missing)))})", everyone)


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def supervise(processes: Sequence[subprocess.Popen[bytes]]) -> int:
    """Wait for the ranks: the first to fail ends the others; 0 when all succeed."""
    def forward(signum: int, _frame: Any) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        codes = [process.poll() for process in processes]
        failed = next((code for code in codes if code), None)
        if failed is not None or all(code is not None for code in codes):
            break
        time.sleep(POLL_SECONDS)
    if failed is None:
        return 0
    rank = codes.index(failed)
    say(f"local rank {rank} exited with code {exit_code(failed)}: stopping the other ranks")
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
    return exit_code(failed)


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
    world = World(os.environ)
    server = serve(world) if world.cross_rank == 0 else None
    ip = resolve(world.address, world.port)
    bracket = f"[{ip}]" if ":" in ip else ip
    arrive(world, f"http://{bracket}:{world.port}")
    interface = interface_of(local_ip_towards(ip, world.port))
    say(f"all {world.cross_size} workers here; starting {world.local_size} rank(s) of {command[0]}"
        f" (rendezvous {ip}:{world.port}, interface {interface or 'by hostname'})")
    processes = [subprocess.Popen(command, env=rank_environment(world, local_rank, ip, interface))
                 for local_rank in range(world.local_size)]
    try:
        return supervise(processes)
    finally:
        if server is not None:
            server.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
