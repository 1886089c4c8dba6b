"""A validating admission webhook that denies the pods of one namespace with a 400 until told to
allow them: what Volcano's or a Kyverno policy's webhook answers while a dataset volume or a
queue isn't there yet. The API server calls it at https://127.0.0.1:PORT (a `url` clientConfig:
the local plane's API server runs on this machine), trusting the cluster's CA that signed its
certificate.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fake_apiserver import JSONHandler

NAME = "deny-pods.chaos.disttrain.dev"
MESSAGE = "the dataset volume is not ready yet (the chaos suite's webhook)"


class DenyingWebhook:
    def __init__(self, cert: Path, key: Path, ca: Path) -> None:
        self.ca = ca
        self.deny = True
        self.denied = 0
        self.allowed = 0
        hook = self

        class Handler(JSONHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_json(200, hook.review(review))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": not self.deny}
        if self.deny:
            self.denied += 1
            response["status"] = {"code": 400, "message": MESSAGE}
        else:
            self.allowed += 1
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def start(self) -> DenyingWebhook:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def configuration(self, namespace: str) -> dict[str, Any]:
        """The ValidatingWebhookConfiguration: pod creates in `namespace` only, failing closed."""
        port = self._server.server_address[1]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": f"chaos-deny-{namespace}"},
            "webhooks": [{
                "name": NAME,
                "clientConfig": {"url": f"https://127.0.0.1:{port}/validate",
                                 "caBundle": base64.b64encode(self.ca.read_bytes()).decode()},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }],
        }
