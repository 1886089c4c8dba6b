"""The progress endpoint's TLS: a CA of the operator's own and a serving certificate it signs,
kept in a Secret so that every replica and every restart serves with the same CA (the pods were
given it when they were made, builders/progress.py).

The first operator to start makes them (P-256 keys; the CA for ten years, the certificate for
one) and creates the Secret; one that finds the Secret keeps its CA, and signs a new serving
certificate when the one there doesn't name the host the pods are told (a renamed Service) or has
less than a month left. What to make is decided and made by runtime/certificates.py, run as a
process of its own: `cryptography` never loads in the operator's. The CA is public (it is in
every reporting pod's annotations); the keys stay in the Secret and in the operator's memory, and
reach disk only as the temporary files Python's `ssl` loads a certificate chain from.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import os
import ssl
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


class SecretAPI(Protocol):
    async def create(self, obj: Mapping[str, Any]) -> str | None: ...
    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None: ...
    async def patch(self, obj: Mapping[str, Any], body: Mapping[str, Any], *, status: bool = False,
                    apply: bool = False) -> None: ...


@dataclass(frozen=True)
class ServingCert:
    ca: bytes  # PEM
    cert: bytes  # PEM, signed by the CA
    key: bytes  # PEM (PKCS#8)

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with tempfile.TemporaryDirectory(prefix="disttrain-tls-") as folder:
            cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
            with open(cert, "wb") as out:
                out.write(self.cert + self.ca)
            with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out:
                out.write(self.key)
            context.load_cert_chain(cert, key)
        return context


def _secret(namespace: str, name: str, data: Mapping[str, bytes] | None = None) -> dict[str, Any]:
    secret: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}}
    if data is not None:
        secret["type"] = "kubernetes.io/tls"
        secret["data"] = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return secret


async def ensure(kube: SecretAPI, namespace: str, name: str, hosts: Sequence[str],
                 now: datetime.datetime | None = None) -> ServingCert:
    """The Secret's CA and a serving certificate for `hosts`: made, kept or renewed."""
    now = now or datetime.datetime.now(datetime.UTC)
    found = await kube.get(_secret(namespace, name))
    if found is None:
        made = await _certificates(None, hosts, now)
        assert made is not None
        if await kube.create(_secret(namespace, name, made)) is not None:
            log.info("progress endpoint: a new CA and serving certificate in Secret %s/%s", namespace, name)
            return ServingCert(made["ca.crt"], made["tls.crt"], made["tls.key"])
        found = await kube.get(_secret(namespace, name))  # another replica made it first
        if found is None:
            raise RuntimeError(f"Secret {namespace}/{name} was taken and is gone")
    data = {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}
    made = await _certificates(data, hosts, now)
    if made is not None:
        await kube.patch(_secret(namespace, name), {"data": {k: base64.b64encode(made[k]).decode()
                                                              for k in ("tls.crt", "tls.key")}})
        log.info("progress endpoint: a new serving certificate for %s in Secret %s/%s", ", ".join(hosts),
                 namespace, name)
        data = made
    return ServingCert(data["ca.crt"], data["tls.crt"], data["tls.key"])


async def _certificates(data: Mapping[str, bytes] | None, hosts: Sequence[str],
                        now: datetime.datetime) -> dict[str, bytes] | None:
    """runtime/certificates.py's answer, from a process of its own."""
    encoded = None if data is None else {k: base64.b64encode(v).decode() for k, v in data.items()}
    asked = {"data": encoded, "hosts": list(hosts), "now": now.isoformat()}
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", "disttrain.runtime.certificates",
                                                 stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE)
    out, err = await child.communicate(json.dumps(asked).encode())
    if child.returncode != 0:
        raise RuntimeError(f"the progress endpoint's certificates could not be made: {err.decode()[-2000:]}")
    made = json.loads(out)
    return made and {k: base64.b64decode(v) for k, v in made.items()}
