"""The in-pod client (operator/disttrain_progress): standard library only, the latest report sent
with the pod's token over TLS, never a failure or a wait for the training; and the endpoint's
certificate (runtime/serving_cert.py, made by runtime/certificates.py in a process of its own) it trusts."""

from __future__ import annotations

import ast
import asyncio
import datetime
import http.server
import json
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeKube

import disttrain_progress
from disttrain.runtime import certificates, serving_cert
from ports import free_port

NOW = datetime.datetime.now(datetime.UTC)


class Endpoint:
    """An HTTPS server answering `answers` in turn (then 202), recording what it was sent."""

    def __init__(self, cert: serving_cert.ServingCert) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.answers: list[tuple[int, dict[str, str]]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.received.append((self.headers["Authorization"], body))
                code, headers = outer.answers.pop(0) if outer.answers else (202, {})
                self.send_response(code)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.socket = cert.ssl_context().wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def cert() -> serving_cert.ServingCert:
    ca, ca_key = certificates.new_ca(NOW)
    tls, key = certificates.sign(ca, ca_key, ["localhost", "127.0.0.1"], NOW)
    return serving_cert.ServingCert(ca, tls, key)


@pytest.fixture
def endpoint(cert: serving_cert.ServingCert) -> Iterator[Endpoint]:
    served = Endpoint(cert)
    yield served
    served.server.shutdown()
    served.server.server_close()


def volume(tmp_path: Path, cert: serving_cert.ServingCert, port: int, role: str = "training") -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "url").write_text(f"https://localhost:{port}/apis/disttrain.dev/v1/namespaces/ml/disttrainjobs/m/progress")
    (tmp_path / "ca.crt").write_bytes(cert.ca)
    (tmp_path / "role").write_text(role)
    (tmp_path / "token").write_text("token-1")
    return tmp_path


def test_the_latest_report_is_sent_with_the_pods_token(tmp_path: Path, cert: serving_cert.ServingCert,
                                                       endpoint: Endpoint) -> None:
    reporter = disttrain_progress.Reporter(str(volume(tmp_path, cert, endpoint.port)), min_interval=0.2)
    assert reporter.enabled and reporter.role == "training"
    reporter.report(epoch=1, total_epochs=3, metrics={"loss": 0.5, "val acc": 0.9, "nan": float("nan"), "x": "?"})
    assert reporter.flush(5)
    (tmp_path / "token").write_text("token-2")  # the kubelet renewed it
    for step in range(50):  # faster than it sends: only the latest of them need go
        reporter.report(step=step, total_steps=100)
    assert reporter.flush(5)
    first, *_, last = endpoint.received
    assert first == ("Bearer token-1", {"epoch": 1, "totalEpochs": 3, "metrics": {"loss": 0.5, "val_acc": 0.9}})
    assert last == ("Bearer token-2", {"step": 49, "totalSteps": 100, "metrics": {}})
    assert len(endpoint.received) < 10


class RemoteValue:
    """What a ParameterServerStrategy coordinator's batch logs are: not a dict (the e2e run's chief
    failed in model.fit with `'RemoteValue' object has no attribute 'items'`)."""


class Unreadable:
    def __float__(self) -> float:
        raise RuntimeError("a tensor on a device that went away")


def test_what_it_cant_read_is_left_out_never_raised(tmp_path: Path, cert: serving_cert.ServingCert,
                                                   endpoint: Endpoint, capsys: pytest.CaptureFixture[str]) -> None:
    reporter = disttrain_progress.Reporter(str(volume(tmp_path, cert, endpoint.port)), min_interval=0.05)
    reporter.report(step=1, metrics=RemoteValue())  # type: ignore[arg-type]
    assert reporter.flush(5)
    reporter.report(step=2, metrics={"loss": Unreadable(), "accuracy": 0.5})
    assert reporter.flush(5)
    reporter.report(epoch="one")  # type: ignore[arg-type]
    assert reporter.flush(5)
    assert [body for _, body in endpoint.received] == [{"step": 1, "metrics": {}},
                                                       {"step": 2, "metrics": {"accuracy": 0.5}}]
    assert "not reported" in capsys.readouterr().err

    @disttrain_progress._never_raises
    def on_train_batch_end(batch: int, logs: Any = None) -> None:
        raise AttributeError("'RemoteValue' object has no attribute 'items'")

    for batch in range(3):
        assert on_train_batch_end(batch) is None
    assert capsys.readouterr().err.count("on_train_batch_end skipped: AttributeError") == 1


def test_throttled_it_waits_as_told_and_sends_the_latest(tmp_path: Path, cert: serving_cert.ServingCert,
                                                         endpoint: Endpoint) -> None:
    endpoint.answers = [(429, {"Retry-After": "1"})]
    reporter = disttrain_progress.Reporter(str(volume(tmp_path, cert, endpoint.port)), min_interval=0.05)
    reporter.report(epoch=1)
    time.sleep(0.3)
    reporter.report(epoch=2)
    started = time.monotonic()
    assert reporter.flush(5)
    assert time.monotonic() - started >= 0.5
    assert [body["epoch"] for _, body in endpoint.received] == [1, 2]


def test_a_name_that_stops_resolving_is_reached_where_it_was(
        tmp_path: Path, cert: serving_cert.ServingCert, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """The e2e MWMS run: `Temporary failure in name resolution` from a busy node's DNS lost 20 s of
    reports to the backoff; the address the name had last is good meanwhile (TLS still checks the name)."""
    reporter = disttrain_progress.Reporter(str(volume(tmp_path, cert, endpoint.port)), min_interval=0.05)
    reporter.report(epoch=1)
    assert reporter.flush(5)

    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    reporter.report(epoch=2)
    assert reporter.flush(5)
    assert [body["epoch"] for _, body in endpoint.received] == [1, 2]


def test_a_name_that_never_resolved_is_asked_again_without_a_growing_backoff(
        tmp_path: Path, cert: serving_cert.ServingCert, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh clone's e2e Horovod run: the node's DNS failed the reporter's first lookups, the
    backoff grew, and the whole training's reports but the last were lost (PROGRESS% went from
    nothing to 100). Six failed lookups then DNS back: the doubling backoff (0.1 s first) would wait
    6.3 s; a resolver's failure is retried at the first backoff instead."""
    monkeypatch.setattr(disttrain_progress, "BACKOFF", (0.1, 60.0))
    real, failed = socket.getaddrinfo, [0]

    def flaky_dns(*args: Any, **kwargs: Any) -> Any:
        if failed[0] < 6:
            failed[0] += 1
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", flaky_dns)
    reporter = disttrain_progress.Reporter(str(volume(tmp_path, cert, endpoint.port)), min_interval=0.05)
    started = time.monotonic()
    reporter.report(epoch=1)
    while not endpoint.received and time.monotonic() - started < 5:
        time.sleep(0.02)
    took = time.monotonic() - started
    assert failed[0] == 6 and [body["epoch"] for _, body in endpoint.received] == [1], endpoint.received
    assert took < 2.0, f"{took:.1f}s"


def test_a_name_that_doesnt_exist_still_backs_off(tmp_path: Path, cert: serving_cert.ServingCert,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """NXDOMAIN (a progress Service gone or misnamed) is no resolver's hiccup: the growing backoff,
    not a lookup a second for as long as training runs (the review of the quick retry)."""
    monkeypatch.setattr(disttrain_progress, "BACKOFF", (0.1, 60.0))
    asked = [0]

    def no_such_name(*args: Any, **kwargs: Any) -> Any:
        asked[0] += 1
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    reporter = disttrain_progress.Reporter(str(volume(tmp_path, cert, free_port())), min_interval=0.05)
    reporter.report(epoch=1)
    time.sleep(1.6)
    assert asked[0] <= 5, f"{asked[0]} lookups in 1.6 s: 0.1, 0.2, 0.4 and 0.8 s apart is 5 at most"


def test_a_flush_does_not_wait_out_a_backoff(tmp_path: Path, cert: serving_cert.ServingCert, endpoint: Endpoint,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """At the end of training the last report is tried again at once, not after the backoff (here
    10 s, past the flush's 5); a Retry-After the operator sent is still waited for."""
    monkeypatch.setattr(disttrain_progress, "BACKOFF", (10.0, 60.0))
    endpoint.answers = [(503, {})]
    reporter = disttrain_progress.Reporter(str(volume(tmp_path, cert, endpoint.port)), min_interval=0.05)
    reporter.report(epoch=4, total_epochs=4)
    assert reporter.flush(5)
    assert [body["epoch"] for _, body in endpoint.received] == [4, 4]


def test_an_unreachable_operator_never_holds_training_back(tmp_path: Path, cert: serving_cert.ServingCert) -> None:
    reporter = disttrain_progress.Reporter(str(volume(tmp_path, cert, free_port())), min_interval=0.05)
    started = time.monotonic()
    for epoch in range(1000):
        reporter.report(epoch=epoch)
    assert time.monotonic() - started < 0.5, "report() only hands the latest over"
    assert not reporter.flush(0.5)


def test_outside_a_reporting_pod_and_off_rank_0_nothing_is_sent(tmp_path: Path, cert: serving_cert.ServingCert,
                                                                endpoint: Endpoint) -> None:
    """A process with no progress volume (not a reporting pod), and every Horovod rank but 0, send
    nothing and start no thread (issue 31: this test asserted a method that always returns None and
    a flush that is true whenever nothing is pending)."""
    outside = disttrain_progress.Reporter(str(tmp_path / "no-volume"))
    outside.report(epoch=1)
    assert not outside.enabled and outside._thread is None
    saved = disttrain_progress._default
    try:
        disttrain_progress._default = disttrain_progress.Reporter(str(volume(tmp_path, cert, endpoint.port)),
                                                                  min_interval=0.05)
        for rank in (3, 2, 1):
            disttrain_progress.for_rank(rank).report(epoch=rank)
        time.sleep(0.3)
        assert endpoint.received == [], "ranks other than 0 sent nothing"
        disttrain_progress.for_rank(0).report(epoch=9)
        assert disttrain_progress.flush(5.0)
        assert [body["epoch"] for _, body in endpoint.received] == [9], "rank 0 reports"
    finally:
        disttrain_progress._default = saved


def test_the_client_needs_only_the_standard_library() -> None:
    source = Path(disttrain_progress.__file__).read_text()
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"__future__"} - {"tensorflow"} <= set(sys.stdlib_module_names)


def test_the_serving_certificate_is_made_once_kept_and_renewed_for_a_new_host() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        first = await serving_cert.ensure(kube, "disttrain-system", "tls", ["progress.disttrain-system.svc"], NOW)
        again = await serving_cert.ensure(kube, "disttrain-system", "tls", ["progress.disttrain-system.svc"], NOW)
        assert again == first, "a restart serves with the same CA and certificate"
        moved = await serving_cert.ensure(kube, "disttrain-system", "tls", ["renamed.disttrain-system.svc"], NOW)
        assert moved.ca == first.ca and moved.cert != first.cert, "the pods' CA still holds"
        assert certificates.covers(moved.cert, ["renamed.disttrain-system.svc"], NOW)
        later = NOW + datetime.timedelta(days=certificates.CERT_DAYS - 10)
        assert not certificates.covers(moved.cert, ["renamed.disttrain-system.svc"], later), "renewed a month ahead"
        context = ssl.create_default_context(cadata=first.ca.decode())
        assert context.cert_store_stats()["x509_ca"] == 1
    asyncio.run(scenario())


def test_the_operator_never_loads_cryptography_for_its_endpoint() -> None:
    """Its 8 MB would stay in the operator's idle RSS (make bench: 63 MB where the target is 60):
    the certificates are made by a process of its own."""
    import subprocess

    probe = ("import sys, asyncio, datetime; sys.path.insert(0, 'tests/unit'); from fakes import FakeKube; "
             "from disttrain.watch import handlers; from disttrain.runtime import serving_cert; "
             "asyncio.run(serving_cert.ensure(FakeKube(), 'ns', 'tls', ['progress.ns.svc'])); "
             "print(sorted(m for m in sys.modules if m.startswith('cryptography')))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_checkpoint_request_is_read_from_its_file_and_confirmed_at_once(
        tmp_path: Path, cert: serving_cert.ServingCert, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: the request is the file the kubelet writes from the pod's annotation (empty until
    asked); the confirmation goes out at once, with the latest counts, past the reports' interval."""
    asked = tmp_path / "checkpoint"
    asked.mkdir()
    (asked / "request").write_text("")
    monkeypatch.setenv("DISTTRAIN_CHECKPOINT_DIR", str(asked))
    assert disttrain_progress.checkpoint_requested() is None, "an empty file: nothing asked"
    (asked / "request").write_text("c20261122-120000-000000")
    assert disttrain_progress.checkpoint_requested() == "c20261122-120000-000000"
    reporter = disttrain_progress.Reporter(str(volume(tmp_path / "v", cert, endpoint.port)), min_interval=60)
    monkeypatch.setattr(disttrain_progress, "_default", reporter)
    reporter.report(epoch=2, step=1200, metrics={"loss": 0.25})
    started = time.monotonic()
    assert disttrain_progress.confirm_checkpoint("c20261122-120000-000000", step=1200, path="/ckpt/1200")
    assert time.monotonic() - started < 5, "not held back by the 60 s between reports"
    assert endpoint.received[-1][1] == {"epoch": 2, "step": 1200, "metrics": {"loss": 0.25}, "checkpoint": {
        "request": "c20261122-120000-000000", "step": 1200, "path": "/ckpt/1200"}}
    assert disttrain_progress.checkpoint_requested() is None, "confirmed: not asked again"
    assert not disttrain_progress.for_rank(1).confirm("c1"), "the other ranks send nothing"
