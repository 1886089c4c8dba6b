"""The progress endpoint in its own process (endpoint/process.py), kept by the controller's
EndpointProcess, against a TokenReview served here: a report reaches the controller's book over the
link, a flood of more connections than it holds grows the endpoint's process within its bound and the controller's
not at all, and a killed endpoint is started again. Before issue 31 the endpoint ran in the
controller's event loop: the same flood grew the operator from 51 to 897 MB."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from test_progress_server import JOB_UID, PODS, Pods, role_of

from disttrain.api.progress import AUDIENCE
from disttrain.control.progress_book import ProgressBook
from disttrain.control.progress_desk import ProgressDesk
from disttrain.runtime.serving_cert import ServingCert, _certificates
from disttrain.watch.progress_supervisor import EndpointProcess

FLOOD = Path(__file__).resolve().parents[1] / "flood.py"
URL_PATH = "/apis/disttrain.dev/v1/namespaces/ml/disttrainjobs/mnist/progress"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def token_reviews(tmp: Path) -> tuple[web.AppRunner, Path]:
    """An API server that answers TokenReviews only: pod_token(uid) is that pod's token."""
    async def review(request: web.Request) -> web.Response:
        token = (await request.json())["spec"]["token"]
        uid = token.split(".")[-1]
        found = PODS.get(uid)
        if found is None:
            return web.json_response({"status": {"authenticated": False, "error": "invalid bearer token"}})
        return web.json_response({"status": {"authenticated": True, "audiences": [AUDIENCE], "user": {
            "username": f"system:serviceaccount:{found[0][0]}:default",
            "extra": {"authentication.kubernetes.io/pod-name": [found[1]],
                      "authentication.kubernetes.io/pod-uid": [uid]}}}})
    app = web.Application()
    app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", review)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "t", "user": {"token": "operator"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    return runner, kubeconfig


def pod_token(uid: str) -> str:
    import base64

    claims = base64.urlsafe_b64encode(json.dumps({"aud": [AUDIENCE], "exp": time.time() + 3600}).encode())
    return f"h.{claims.decode().rstrip('=')}.{uid}"  # a JWT's shape; its "signature" names the pod


def report(port: int, ca: bytes, token: str) -> int:
    import http.client

    context = ssl.create_default_context(cadata=ca.decode())
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        connection.request("POST", URL_PATH, body=b'{"epoch": 1}', headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        return connection.getresponse().status
    except OSError:
        return 0
    finally:
        connection.close()


async def until_accepted(port: int, ca: bytes, token: str, seconds: float = 30.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if await asyncio.to_thread(report, port, ca, token) == 202:
            return time.monotonic() - started
        await asyncio.sleep(0.2)
    raise AssertionError(f"no report accepted in {seconds}s")


def test_the_endpoint_runs_apart_and_a_flood_costs_the_controller_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    made = asyncio.run(_certificates(None, ["127.0.0.1", "localhost"], datetime.datetime.now(datetime.UTC)))
    assert made is not None
    cert = ServingCert(made["ca.crt"], made["tls.crt"], made["tls.key"])
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    bearer = pod_token("uid-w0")

    async def main() -> None:
        reviews, kubeconfig = await token_reviews(tmp_path)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        book, port = ProgressBook(), free_port()

        async def certificate() -> ServingCert:
            return cert
        endpoint = EndpointProcess(port, ProgressDesk(Pods(), book, role_of), certificate, host="127.0.0.1")
        endpoint.start()
        try:
            await until_accepted(port, cert.ca, bearer)
            found = book.state(("ml", "mnist"), JOB_UID)
            assert found is not None and found.training is not None, "the report reached the controller's book"
            assert endpoint.process is not None
            child, ours = endpoint.process.pid, os.getpid()
            assert os.getpriority(os.PRIO_PROCESS, child) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10), \
                "the endpoint runs niced: a handshake flood takes CPU from it before the controller"
            before = {"endpoint": rss_mib(child), "controller": rss_mib(ours)}
            began = time.monotonic()
            flood = await asyncio.create_subprocess_exec(
                sys.executable, str(FLOOD), "127.0.0.1", str(port), "--connections", "600", "--seconds", "4",
                "--sources", "127.0.0.2-90", stdout=subprocess.PIPE)
            peak = dict(before)
            while flood.returncode is None:
                peak = {"endpoint": max(peak["endpoint"], rss_mib(child)),
                        "controller": max(peak["controller"], rss_mib(ours))}
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(flood.wait(), 0.2)
            tally = json.loads((await flood.stdout.read()).decode())  # type: ignore[union-attr]
            print(f"flood {tally}; RSS MiB before {before}, peak {peak}; {time.monotonic() - began:.1f}s")
            assert peak["endpoint"] < 384, "within the endpoint's memory bound"
            assert peak["controller"] - before["controller"] < 16, "the controller's memory untouched"
            assert await until_accepted(port, cert.ca, bearer) < 10, "reports accepted again after the flood"
            os.kill(child, signal.SIGKILL)
            print(f"restarted in {await until_accepted(port, cert.ca, bearer):.1f}s")
            assert endpoint.starts == 2, "a killed endpoint is started again"
        finally:
            await endpoint.stop()
            await reviews.cleanup()
        assert endpoint.process is not None and endpoint.process.returncode is not None, "no endpoint left behind"
    asyncio.run(main())


class Secrets:
    """The one Secret serving_cert.ensure keeps the CA and certificate in."""

    def __init__(self) -> None:
        self.secret: dict[str, Any] | None = None

    async def create(self, obj: Any) -> str | None:
        self.secret = json.loads(json.dumps(obj))
        return "created"

    async def get(self, obj: Any) -> dict[str, Any] | None:
        return self.secret

    async def patch(self, obj: Any, body: Any, *, status: bool = False, apply: bool = False, manager: str = "") -> None:
        assert self.secret is not None
        self.secret["data"].update(body["data"])


def served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.getpeercert(binary_form=True) or b""


def test_a_certificate_near_its_expiry_is_renewed_while_the_endpoint_runs(monkeypatch: Any) -> None:
    """Issue 31: the serving certificate was made or renewed only when the operator started; one
    that ran past its certificate's year served an expired one. Now it is checked while running:
    under a month left, a new one (same CA) is made and the running endpoint serves it."""
    from disttrain.runtime import serving_cert
    from disttrain.watch import progress_supervisor

    monkeypatch.setattr(progress_supervisor, "CERT_CHECK_SECONDS", 0.5)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    secrets, clock = Secrets(), [datetime.datetime.now(datetime.UTC)]

    async def certificate() -> ServingCert:
        return await serving_cert.ensure(secrets, "ns", "tls", ["127.0.0.1"], now=clock[0])

    async def main() -> None:
        port = free_port()
        endpoint = EndpointProcess(port, ProgressDesk(Pods(), ProgressBook(), role_of), certificate, host="127.0.0.1")
        endpoint.start()
        try:
            first = await until_served(port)
            ca = secrets.secret["data"]["ca.crt"]  # type: ignore[index]
            clock[0] += datetime.timedelta(days=340)  # the certificate (a year) has under a month left
            started = time.monotonic()
            while (now := await until_served(port)) == first and time.monotonic() - started < 20:
                await asyncio.sleep(0.2)
            assert now != first, "the running endpoint serves the renewed certificate"
            assert secrets.secret["data"]["ca.crt"] == ca, "the CA is kept"  # type: ignore[index]
            assert endpoint.starts == 1, "renewed without a restart"
        finally:
            await endpoint.stop()
    asyncio.run(main())


async def until_served(port: int) -> bytes:
    for _ in range(100):
        try:
            return await asyncio.to_thread(served_certificate, port)
        except OSError:
            await asyncio.sleep(0.2)
    raise AssertionError("the endpoint never served")


def test_the_endpoints_process_loads_no_kubernetes_client_library() -> None:
    """Issue 45: the endpoint kept kopf's client libraries out only after its imports had loaded
    them (kopf imports `kubernetes` if it is installed, as the light install has it): 94 MB
    resident idle on the plane, 102 MB here with the dev venv's `kubernetes_asyncio` too, the larger
    of the operator's two processes. Its entry now keeps them out first."""
    probe = ("import sys, runpy\n"
             "sys.argv = ['disttrain.endpoint', '--help']\n"
             "try:\n"
             "    runpy.run_module('disttrain.endpoint', run_name='__main__', alter_sys=True)\n"
             "except SystemExit:\n"
             "    pass\n"
             "rss = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS:')][0] // 1024\n"
             "loaded = sorted(m for m in ('kubernetes', 'kubernetes_asyncio', 'pykube', 'pydantic')\n"
             "                if sys.modules.get(m))\n"
             "print(rss, ','.join(loaded))\n")
    last = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          timeout=60).stdout.splitlines()[-1]  # after --help's usage
    rss, loaded = last.split(" ")
    assert loaded.strip() == "", f"the endpoint's process loaded {loaded.strip()}"
    assert int(rss) < 70, f"{rss} MiB resident once its modules are loaded"
