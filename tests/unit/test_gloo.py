"""Horovod without SSH (spec.mpi.bootstrap Gloo): what the operator builds, and its bootstrap."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import (
    GLOO_NEEDS_COMMAND,
    GLOO_NO_LAUNCHER,
    GLOO_NOT_ELASTIC,
    GLOO_WHOLE_RESTARTS,
    SpecError,
    parse_spec,
)
from disttrain.api.spec import JobSpec, MPIBootstrap, MPIImplementation, MPISpec
from disttrain.builders import gloo
from disttrain.builders.desired import config_map, job_pod, supporting_objects
from disttrain.builders.render import render, render_objects
from disttrain.decide.policies import success
from disttrain_gloo import bootstrap
from manifests import gloo_job, mpi_job

REF = JobRef(name="hvd", namespace="ml", uid="uid-1")
BOOTSTRAP = Path(bootstrap.__file__)


def spec_of(job: dict[str, Any]) -> JobSpec:
    return parse_spec(job["spec"])


def mpi_of(job: dict[str, Any]) -> MPISpec:
    mpi = spec_of(job).mpi
    assert mpi is not None
    return mpi


def test_a_worker_runs_its_command_through_the_bootstrap_with_its_share_of_the_world() -> None:
    spec = spec_of(gloo_job(workers=3, gpus=2))
    pod = job_pod(REF, spec, PodKey("worker", 1))
    first = pod["spec"]["containers"][0]
    assert first["command"] == ["python3", "/etc/mpi/disttrain_gloo.py"]
    assert first["args"] == ["--", "python", "/train.py"]
    env = {e["name"]: e["value"] for e in first["env"]}
    assert env.items() >= {
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_HOSTNAME": "hvd-worker-1",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "hvd-worker-0.hvd.ml.svc", "HOROVOD_GLOO_RENDEZVOUS_PORT": "29410",
        "HOROVOD_SIZE": "6", "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "3"}.items()
    assert not {"HOROVOD_RANK", "HOROVOD_LOCAL_RANK"} & set(env), "each process's own: the bootstrap's"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "mpi-config")
    assert volume["configMap"] == {"name": "hvd-mpi", "items": [
        {"key": "disttrain_gloo.py", "path": "disttrain_gloo.py", "mode": 0o444}]}
    assert {"name": "mpi-config", "mountPath": "/etc/mpi", "readOnly": True} in first["volumeMounts"]
    # No SSH anywhere: no key volume, no sshd probe, no port 22.
    assert not [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert "startupProbe" not in first and "ssh" not in yaml.safe_dump(pod).lower()


def test_the_command_and_args_are_kept_in_order() -> None:
    job = gloo_job()
    job["spec"]["mpi"]["worker"]["template"]["spec"]["containers"][0]["args"] = ["--epochs", "3"]
    first = job_pod(REF, spec_of(job), PodKey("worker", 0))["spec"]["containers"][0]
    assert first["args"] == ["--", "python", "/train.py", "--epochs", "3"]


def test_the_job_gets_a_service_with_the_rendezvous_port_and_the_bootstrap_but_no_secret() -> None:
    spec = spec_of(gloo_job())
    objects = supporting_objects(REF, spec, None)
    kinds = [o["kind"] for o in objects]
    assert "Secret" not in kinds and kinds[:2] == ["Service", "ConfigMap"]
    assert objects[0]["spec"]["ports"] == [{"name": "gloo-rendezvous", "port": 29410, "targetPort": 29410}]
    assert objects[1]["data"] == {"disttrain_gloo.py": BOOTSTRAP.read_text()}
    assert config_map(REF, spec, [0, 1]) is None, "a job keeps the bootstrap it was made with"


def test_there_is_no_launcher_pod() -> None:
    spec = spec_of(gloo_job(workers=2))
    assert list(spec.replicas) == ["worker"] and spec.total_pods == 2


def test_each_rank_the_operator_shows_is_the_one_the_bootstrap_starts() -> None:
    """`disttrain render`'s ranks (builders/gloo.rank_env) and the bootstrap's (World.rank_env):
    worker by worker, local ranks inside, as horovodrun assigns ranks to hosts of equal slots."""
    mpi = mpi_of(gloo_job(workers=3, gpus=4))
    seen = []
    for worker in range(3):
        env = {e["name"]: e["value"] for e in job_pod(REF, spec_of(gloo_job(workers=3, gpus=4)),
                                                       PodKey("worker", worker))["spec"]["containers"][0]["env"]}
        world = bootstrap.World(env)
        for local in range(4):
            assert gloo.rank_env(mpi, worker, local) == world.rank_env(local)
            seen.append(int(world.rank_env(local)["HOROVOD_RANK"]))
    assert seen == list(range(12))


@pytest.mark.parametrize(("edit", "field", "message"), [
    (lambda m: m.update(launcher={"template": {"spec": {"containers": [{"name": "l", "image": "i"}]}}}),
     "spec.mpi.launcher", GLOO_NO_LAUNCHER),
    (lambda m: m.update(elastic={"minReplicas": 1, "maxReplicas": 3}), "spec.mpi.elastic", GLOO_NOT_ELASTIC),
    (lambda m: m["worker"]["template"]["spec"]["containers"][0].pop("command"),
     "spec.mpi.worker.template.spec.containers[0].command", GLOO_NEEDS_COMMAND),
    (lambda m: m["worker"].update(restartPolicy="OnFailure"), "spec.mpi.worker.restartPolicy", GLOO_WHOLE_RESTARTS),
])
def test_what_gloo_cannot_run_is_refused_with_why(edit: Any, field: str, message: str) -> None:
    job = gloo_job()
    edit(job["spec"]["mpi"])
    with pytest.raises(SpecError, match="^" + field.replace("[", r"\[").replace("]", r"\]")) as err:
        spec_of(job)
    assert message in str(err.value)


def test_ssh_still_needs_its_launcher() -> None:
    job = mpi_job()
    del job["spec"]["mpi"]["launcher"]
    with pytest.raises(SpecError, match=r"^spec\.mpi\.launcher: an MPI job with bootstrap SSH needs a launcher"):
        spec_of(job)


def _pod(index: int, phase: str) -> ObservedPod:
    return ObservedPod(name=f"hvd-worker-{index}", uid=f"u{index}", owner_uid="uid-1", replica_type="worker",
                       index=index, phase=phase, ready=True, terminating=False, exit_code=0, reason=None,
                       container_restarts=0)


def test_the_job_succeeds_when_every_worker_has() -> None:
    spec = spec_of(gloo_job(workers=3))
    assert success.success_message(spec, [_pod(0, "Succeeded"), _pod(1, "Succeeded"), _pod(2, "Running")]) is None
    assert success.success_message(spec, [_pod(i, "Succeeded") for i in range(3)]) == "all 3 workers succeeded"


def test_render_shows_each_ranks_environment_and_still_loads_back() -> None:
    job = gloo_job(workers=2, gpus=2)
    out = render(yaml.safe_dump(job))
    assert "# hvd-worker-1 runs 2 process(es)" in out
    assert "#   HOROVOD_RANK=2 HOROVOD_LOCAL_RANK=0 PYTHONUNBUFFERED=1\n#   HOROVOD_RANK=3 HOROVOD_LOCAL_RANK=1" in out
    assert list(yaml.safe_load_all(out)) == render_objects(job)


# --- the bootstrap: its store, its server, and its processes -----------------------------------

def test_a_scope_is_cleared_once_every_rank_in_it_has_finished() -> None:
    store = bootstrap.Store(size=2)
    for rank in ("0", "1"):  # Gloo's connectFullMesh: the rank's hostname and its addresses
        assert store.put("global", f"rank_{rank}", b"host") and store.put("global", rank, b"a" * 136)
    store.finish("global", "0")
    assert store.get("global", "0") == b"a" * 136, "rank 1 may still be reading rank 0's"
    store.finish("global", "1")
    assert store.get("global", "rank_0") is None and store.keys == 0 and store.bytes == 0
    store.finish("nowhere", "0")  # a DELETE of nothing is no error


def one_init(store: bootstrap.Store, workers: int, slots: int) -> None:
    """The keys one hvd.init() of Horovod 0.28.1 puts and deletes (recorded through the bootstrap
    from real Horovod: global, local and cross scopes, and the same for process set 0), each
    scope's ranks all putting before any deletes, as Gloo's barrier makes them."""
    size = workers * slots
    scopes = [("global", range(size))] + [(f"local_hvd-worker-{w}", range(slots)) for w in range(workers)] + [
        (f"cross_{s}", range(workers)) for s in range(slots)]
    for suffix in ("", "_process_set_hash_1"):
        for scope, ranks in scopes:
            for rank in ranks:
                assert store.put(scope + suffix, f"rank_{rank}", b"h" * 40), (scope, rank, store.keys)
                assert store.put(scope + suffix, str(rank), b"a" * 136 * (len(ranks) - 1)), (scope, rank)
            for rank in ranks:
                store.finish(scope + suffix, str(rank))


@pytest.mark.parametrize(("workers", "slots"), [(8, 1), (2, 4), (1, 8), (64, 8)])
def test_a_world_can_init_again_and_again_within_the_bounds(workers: int, slots: int) -> None:
    store = bootstrap.Store(size=workers * slots)
    for worker in range(workers):
        store.put(bootstrap.ARRIVAL_SCOPE, str(worker), b"1")
    for _ in range(3):
        one_init(store, workers, slots)
        assert set(store.scopes) == {bootstrap.ARRIVAL_SCOPE}, "every rendezvous scope cleared after it"


def test_a_delete_of_what_was_never_put_stores_nothing() -> None:
    store = bootstrap.Store(size=2)
    store.put("global", "0", b"a")
    for i in range(2000):
        store.finish("global", f"x{i}")
        store.finish("global", str(100 + i))
        store.finish(f"s{i}", "0")
    assert store.finished.get("global", set()) == set() and list(store.scopes) == ["global"]


def test_the_store_refuses_more_keys_or_bytes_than_a_world_needs() -> None:
    store = bootstrap.Store(size=1)
    assert all(store.put("s", str(i), b"") for i in range(store.max_keys))
    assert not store.put("s", "one-more", b"") and not store.put("other", "0", b"")
    assert "other" not in store.scopes
    big = bootstrap.Store(size=1)
    assert big.put("s", "0", b"x" * (big.max_bytes - 1))
    assert not big.put("s", "1", b"xx")
    assert big.put("s", "0", b"small"), "a value replaced frees its bytes"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[bootstrap.Server, int]]:
    monkeypatch.setattr(bootstrap.Handler, "timeout", 0.5)
    monkeypatch.setattr(bootstrap, "REQUEST_SECONDS", 1.0)
    server = bootstrap.Server(0, bootstrap.Store(size=2), max_connections=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, server.server_address[1]
    server.shutdown()
    server.server_close()


def raw(port: int, data: bytes, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        return s.recv(4096) if read else b""


def test_the_server_speaks_horovods_rendezvous_protocol(server: tuple[bootstrap.Server, int]) -> None:
    port = server[1]
    base = f"http://127.0.0.1:{port}"
    assert bootstrap.call("GET", f"{base}/global/0") == 404
    assert bootstrap.call("PUT", f"{base}/global/0", b"addr") == 200
    assert bootstrap.call("GET", f"{base}/global/0") == 200
    assert bootstrap.call("DELETE", f"{base}/global/0") == 200
    assert bootstrap.call("GET", f"{base}/global/0") == 404


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /global HTTP/1.0\r\n\r\n", b"400"),
    (b"GET /a/b/c HTTP/1.0\r\n\r\n", b"400"),
    (b"GET /glo%00bal/0 HTTP/1.0\r\n\r\n", b"400"),
    (b"GET /" + b"s" * 200 + b"/0 HTTP/1.0\r\n\r\n", b"400"),
    (b"PUT /global/0 HTTP/1.0\r\n\r\n", b"411"),
    (b"PUT /global/0 HTTP/1.0\r\nContent-Length: -1\r\n\r\n", b"411"),
    (b"PUT /global/0 HTTP/1.0\r\nContent-Length: 99999999999\r\n\r\n", b"413"),
    ("PUT /global/0 HTTP/1.0\r\nContent-Length: \u00b2\r\n\r\n".encode(), b"411"),
    (b"PUT /global/0 HTTP/1.0\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", b"411"),
    (b"\x00\xff\xfe garbage\r\n\r\n", b"400"),
])
def test_malformed_or_huge_requests_get_an_error_not_memory(server: tuple[bootstrap.Server, int],
                                                           request_bytes: bytes, status: bytes) -> None:
    reply = raw(server[1], request_bytes)
    # Bytes that aren't HTTP get the standard library's error page alone (an HTTP/0.9 answer).
    assert reply.split(b" ")[1] == status or b"Error code: " + status in reply, reply
    assert server[0].store.keys == 0


def test_a_flood_of_idle_connections_neither_holds_it_nor_stops_it(server: tuple[bootstrap.Server, int]) -> None:
    srv, port = server
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]  # 4 allowed at once
    try:
        time.sleep(0.2)
        assert threading.active_count() < 30
    finally:
        for s in idle:
            s.close()
    # The held ones are hung up on (REQUEST_SECONDS, 1 s here), the rest were closed at once: it answers again.
    deadline = time.monotonic() + 5
    while bootstrap.call("PUT", f"http://127.0.0.1:{port}/global/0", b"a") != 200:
        assert time.monotonic() < deadline, "the server never came back"
        time.sleep(0.1)
    assert srv.store.get("global", "0") == b"a"


def test_a_request_trickled_byte_by_byte_is_hung_up_on_at_its_deadline(server: tuple[bootstrap.Server, int]) -> None:
    """Each read within the per-read timeout (0.5 s), the whole past REQUEST_SECONDS (1 s): the
    connection is closed at the deadline, and four such can't hold the server's four slots."""
    port = server[1]
    trickles = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    started = time.monotonic()
    try:
        closed = 0
        for byte in b"PUT /global/0 HTTP/1.0\r\nX: " + b"a" * 40:
            for s in trickles:
                with contextlib.suppress(OSError):
                    s.sendall(bytes([byte]))
            time.sleep(0.2)
            if time.monotonic() - started > 3:
                break
        closed = sum(1 for s in trickles if _closed(s))
        assert closed == 4, "each hung up on"
    finally:
        for s in trickles:
            s.close()
    assert bootstrap.call("PUT", f"http://127.0.0.1:{port}/global/0", b"a") == 200


def _closed(s: socket.socket) -> bool:
    s.settimeout(1)
    try:
        return s.recv(1) == b""
    except OSError:
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(index: int, workers: int, slots: int, port: int, command: list[str], tmp: Path) -> subprocess.Popen[bytes]:
    """Worker `index`'s bootstrap; its ranks write into tmp/ranks, its own lines go to tmp/bootstrap-<index>."""
    (tmp / "ranks").mkdir(exist_ok=True)
    env = {**os.environ, "HOROVOD_SIZE": str(workers * slots), "HOROVOD_LOCAL_SIZE": str(slots),
           "HOROVOD_CROSS_RANK": str(index), "HOROVOD_CROSS_SIZE": str(workers),
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": "localhost", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
           "OUT": str(tmp / "ranks"),
           # An image's proxy settings, whose no_proxy can't name a pod network: never used here.
           "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "no_proxy": "10.0.0.0/8"}
    with open(tmp / f"bootstrap-{index}", "wb") as log:
        return subprocess.Popen([sys.executable, str(BOOTSTRAP), "--", *command], env=env, stderr=log)


RECORD = ("import json, os; r = os.environ['HOROVOD_RANK']; "
          "open(os.path.join(os.environ['OUT'], r), 'w').write(json.dumps(dict(os.environ)))")


def test_workers_start_together_and_each_slot_is_a_rank(tmp_path: Path) -> None:
    """Worker 1 starts 1.5 s after worker 0 (a late pod): neither starts its ranks until both are
    here; then 2 x 2 processes, ranks 0-3, the rendezvous address resolved."""
    port = _free_port()
    first = _worker(0, 2, 2, port, [sys.executable, "-c", RECORD], tmp_path)
    time.sleep(1.5)
    assert not list((tmp_path / "ranks").iterdir()), "worker 0 waits for worker 1"
    second = _worker(1, 2, 2, port, [sys.executable, "-c", RECORD], tmp_path)
    assert first.wait(30) == 0 and second.wait(30) == 0

    envs = {int(p.name): json.loads(p.read_text()) for p in (tmp_path / "ranks").iterdir()}
    assert sorted(envs) == [0, 1, 2, 3]
    assert [envs[r]["HOROVOD_LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
    assert {envs[r]["HOROVOD_GLOO_RENDEZVOUS_ADDR"] for r in range(4)} <= {"127.0.0.1", "::1"}
    assert all(envs[r]["HOROVOD_GLOO_IFACE"] == "lo" and envs[r]["PYTHONUNBUFFERED"] == "1" for r in range(4))


def test_the_first_rank_to_fail_ends_the_others_and_gives_the_pod_its_code(tmp_path: Path) -> None:
    port = _free_port()
    command = [sys.executable, "-c",
               "import os, signal, time\nif os.environ['HOROVOD_LOCAL_RANK'] == '1': os.kill(os.getpid(), 9)\n"
               "time.sleep(60)"]
    started = time.monotonic()
    proc = _worker(0, 1, 2, port, command, tmp_path)
    assert proc.wait(30) == 137, "SIGKILL: 128 + 9, retryable under restartPolicy ExitCode"
    assert time.monotonic() - started < 20, "the sleeping rank was stopped, not waited for"
    assert "local rank 1 exited with code 137" in (tmp_path / "bootstrap-0").read_text()


def test_a_killed_rank_is_the_pods_code_even_when_its_peer_fails_just_after(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed (137: retryable), rank 0 exiting 1 50 ms later as its peer's loss makes it
    (1: fatal under ExitCode): the pod says 137, what happened first. Rank 0 exits 50 ms after rank 1
    says it is about to be killed (each rank's own clock from its start made the order the two
    processes' start order: a CI run started rank 1 over 50 ms after rank 0, which then ended first).
    A bootstrap kept off the CPU finds both ended at once; it still says 137 (Ranks._cause)."""
    command = [sys.executable, "-c",
               "import os, pathlib, time\nmark = pathlib.Path(os.environ['OUT'], 'killed')\n"
               "if os.environ['HOROVOD_LOCAL_RANK'] == '1':\n"
               "    time.sleep(0.5); mark.touch(); os.kill(os.getpid(), 9)\n"
               "while not mark.exists(): time.sleep(0.005)\ntime.sleep(0.05); raise SystemExit(1)"]
    for _ in range(3):
        (tmp_path / "ranks" / "killed").unlink(missing_ok=True)
        assert _worker(0, 1, 2, _free_port(), command, tmp_path).wait(30) == 137


def test_a_killed_rank_found_ended_with_a_failed_peer_is_the_pods_code() -> None:
    """Both ranks ended before the bootstrap looks (a busy node keeps it off the CPU): rank 0 exited
    1, rank 1 was SIGKILLed. waitpid reaps the older child first; the pod still says 137."""
    script = ("import os, sys, time\nfrom disttrain_gloo import bootstrap\nranks = bootstrap.Ranks()\n"
              "rank = \"import os\\nif os.environ['R'] == '1': os.kill(os.getpid(), 9)\\nraise SystemExit(1)\"\n"
              "ranks.start([sys.executable, '-c', rank], [dict(os.environ, R='0'), dict(os.environ, R='1')])\n"
              "time.sleep(1.0)\nsys.exit(ranks.wait())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 137, done.stderr
    assert "local rank 1 exited with code 137" in done.stderr


def test_several_ranks_output_comes_whole_lines_each_prefixed_with_its_rank(tmp_path: Path) -> None:
    """Two ranks printing unbuffered at once (print's text and newline are two writes), a line with
    no newline last, and one longer than the relay's piece: every line arrives whole, prefixed as
    horovodrun prefixes it, before the bootstrap exits."""
    command = [sys.executable, "-u", "-c",
               "import json, os, sys\nr = os.environ['HOROVOD_RANK']\n"
               "for i in range(2000): print(json.dumps({'rank': r, 'i': i, 'pad': 'x' * 50}))\n"
               "print('e' * 70000, file=sys.stderr)\nsys.stdout.write('last-' + r)"]
    out = tmp_path / "stdout"
    with open(out, "wb") as stdout, open(tmp_path / "stderr", "wb") as stderr:
        env = {**os.environ, "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0",
               "HOROVOD_CROSS_SIZE": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "localhost",
               "HOROVOD_GLOO_RENDEZVOUS_PORT": str(_free_port())}
        proc = subprocess.Popen([sys.executable, str(BOOTSTRAP), "--", *command], env=env, stdout=stdout,
                                stderr=stderr)
        assert proc.wait(60) == 0
    lines = out.read_text().splitlines()
    events = [(line[:len("[0]<stdout>:")], json.loads(line[len("[0]<stdout>:"):])) for line in lines
              if not line.split(":", 1)[1].startswith("last-")]
    assert sorted((e["rank"], e["i"]) for _, e in events) == sorted((r, i) for r in "01" for i in range(2000))
    assert all(prefix == f"[{e['rank']}]<stdout>:" for prefix, e in events)
    assert sorted(line for line in lines if "last-" in line) == ["[0]<stdout>:last-0", "[1]<stdout>:last-1"]
    long_pieces = [line for line in (tmp_path / "stderr").read_text().splitlines() if "<stderr>:e" in line]
    assert sorted(len(line.split(":", 1)[1]) for line in long_pieces) == sorted(
        [bootstrap.LINE_BYTES, 70000 - bootstrap.LINE_BYTES] * 2), "a line over 64 KiB comes in prefixed pieces"


def test_a_rank_writing_to_a_closed_log_is_not_blocked_and_its_code_is_the_pods(tmp_path: Path) -> None:
    """The container's stdout closed (a log pipe gone): the relay keeps reading each rank's output
    and drops it, so a rank writing more than a pipe holds ends, and the pod exits with its code."""
    read, write = os.pipe()
    os.close(read)  # whatever is written to `write` now fails (EPIPE)
    command = [sys.executable, "-c", "import sys\nfor _ in range(4000): print('x' * 100)\nsys.exit(3)"]
    env = {**os.environ, "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0",
           "HOROVOD_CROSS_SIZE": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "localhost",
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(_free_port())}
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = subprocess.Popen([sys.executable, str(BOOTSTRAP), "--", *command], env=env, stdout=write, stderr=stderr)
    os.close(write)
    assert proc.wait(60) == 3


def test_sigterm_before_the_ranks_start_ends_the_bootstrap_at_once(tmp_path: Path) -> None:
    """Waiting for a worker that never comes: a SIGTERM (a delete, a suspend) ends it with 143,
    not after the pod's grace period (as the container's PID 1 it would otherwise ignore it)."""
    proc = _worker(0, 2, 1, _free_port(), [sys.executable, "-c", "pass"], tmp_path)
    time.sleep(1.5)
    sent = time.monotonic()
    proc.terminate()
    assert proc.wait(10) == 143 and time.monotonic() - sent < 2


def test_sigterm_reaches_every_rank(tmp_path: Path) -> None:
    port = _free_port()
    command = [sys.executable, "-c",
               "import os, signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *a: (open(os.path.join(os.environ['OUT'], "
               "os.environ['HOROVOD_RANK']), 'w').close(), sys.exit(143)))\n"
               "open(os.path.join(os.environ['OUT'], 'up-' + os.environ['HOROVOD_RANK']), 'w').close()\n"
               "time.sleep(60)"]
    proc = _worker(0, 1, 2, port, command, tmp_path)
    deadline = time.monotonic() + 20
    while len(list((tmp_path / "ranks").glob("up-*"))) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.terminate()
    assert proc.wait(20) == 143
    assert {p.name for p in (tmp_path / "ranks").iterdir()} >= {"0", "1"}


def test_the_ranks_share_the_containers_cpus() -> None:
    job = gloo_job(workers=2, gpus=2)
    container = job["spec"]["mpi"]["worker"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["cpu"] = "5"

    def omp() -> str:
        first = job_pod(REF, spec_of(job), PodKey("worker", 0))["spec"]["containers"][0]
        return str(next(e["value"] for e in first["env"] if e["name"] == "OMP_NUM_THREADS"))
    assert omp() == "2", "5 CPUs for 2 processes"
    container["env"] = [{"name": "OMP_NUM_THREADS", "value": "7"}]
    assert omp() == "7", "the template's own wins"


def test_the_python_clients_mpi_keeps_its_positional_fields() -> None:
    from disttrain.client.jobs import MPI, Replica

    worker = Replica(replicas=2)
    mpi = MPI(Replica(), worker, MPIImplementation.INTELMPI)
    assert mpi.implementation is MPIImplementation.INTELMPI and mpi.bootstrap is None
    assert MPI(None, worker, bootstrap=MPIBootstrap.GLOO).bootstrap is MPIBootstrap.GLOO


def test_no_command_is_a_usage_error() -> None:
    assert bootstrap.main(["--"]) == 2


def test_the_bootstrap_is_ascii_so_render_shows_it_as_a_block() -> None:
    """PyYAML quotes a string with a non-ASCII character on one line (`disttrain render`'s ConfigMap)."""
    assert BOOTSTRAP.read_text().isascii()
