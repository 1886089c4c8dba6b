"""An API server that answers only what a client asks before anything else: its version,
discovery, and an empty Secret list (helm's release storage). Enough to see what helm and the
operator do against a cluster too old for them, without running one."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml


def _resource(name: str, kind: str, namespaced: bool = True) -> dict[str, Any]:
    return {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}


def answers(version: str) -> dict[str, dict[str, Any]]:
    major, minor = version.split(".")[:2]
    return {
        "/version": {"major": major, "minor": minor, "gitVersion": f"v{version}", "gitCommit": "0" * 40,
                     "gitTreeState": "clean", "buildDate": "2024-01-01T00:00:00Z", "goVersion": "go1.21",
                     "compiler": "gc", "platform": "linux/amd64"},
        "/api": {"kind": "APIVersions", "versions": ["v1"],
                 "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
        "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            _resource("secrets", "Secret"), _resource("serviceaccounts", "ServiceAccount"),
            _resource("services", "Service"), _resource("namespaces", "Namespace", namespaced=False)]},
    }


class JSONHandler(BaseHTTPRequestHandler):
    """A tiny HTTP server's handler that answers JSON and logs nothing (the test reads what the
    clients say): this fake API server's, and the stand-ins of other tests."""

    def send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port, for the block: its URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


class _Handler(JSONHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/") or "/"
        body = self.server.answers.get(path)
        if body is None and path.startswith("/api/v1/namespaces/") and path.endswith("/secrets"):
            body = {"kind": "SecretList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}
        status = 200 if body is not None else 404
        if body is None:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
        self.send_json(status, body)


class _Server(ThreadingHTTPServer):
    answers: dict[str, dict[str, Any]]


@contextmanager
def old_apiserver(tmp: Path, version: str = "1.29.4") -> Iterator[Path]:
    """A kubeconfig for a fake API server that reports `version`."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.answers = answers(version)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp / "old.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "old",
        "clusters": [{"name": "old", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "old", "user": {}}],
        "contexts": [{"name": "old", "context": {"cluster": "old", "user": "old", "namespace": "default"}}],
    }))
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
