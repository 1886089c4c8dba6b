"""The progress endpoint's TLS: a CA of the operator's own and a serving certificate it signs,
kept in a Secret so that every replica and every restart serves with the same CA (the pods were
given it when they were made, build/progress.py).

The first operator to start makes them (P-256 keys; the CA for ten years, the certificate for
one) and creates the Secret; one that finds the Secret keeps its CA, and signs a new serving
certificate when the one there doesn't name the host the pods are told (a renamed Service) or has
less than a month left. The CA is public (it is in every reporting pod's annotations); the keys
stay in the Secret and in the operator's memory, and reach disk only as the temporary files
Python's `ssl` loads a certificate chain from.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = logging.getLogger(__name__)
CA_YEARS, CERT_DAYS, RENEW_DAYS = 10, 365, 30


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


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def new_ca(now: datetime.datetime) -> tuple[bytes, bytes]:
    """A CA certificate and its key, PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("disttrain progress CA")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365 * CA_YEARS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def sign(ca_pem: bytes, ca_key_pem: bytes, hosts: Sequence[str], now: datetime.datetime) -> tuple[bytes, bytes]:
    """A serving certificate for `hosts` (DNS names or IP addresses) and its key, PEM."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def covers(cert_pem: bytes, hosts: Sequence[str], now: datetime.datetime) -> bool:
    """Whether the certificate names every host and is good for RENEW_DAYS more."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    if cert.not_valid_after_utc - now < datetime.timedelta(days=RENEW_DAYS):
        return False
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    named = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} | set(names.get_values_for_type(x509.DNSName))
    return all(str(_normal(host)) in named for host in hosts)


def _normal(host: str) -> object:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return host


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
        ca, ca_key = new_ca(now)
        cert, key = sign(ca, ca_key, hosts, now)
        data = {"ca.crt": ca, "ca.key": ca_key, "tls.crt": cert, "tls.key": key}
        if await kube.create(_secret(namespace, name, data)) is not None:
            log.info("progress endpoint: a new CA and serving certificate in Secret %s/%s", namespace, name)
            return ServingCert(ca, cert, key)
        found = await kube.get(_secret(namespace, name))  # another replica made it first
        if found is None:
            raise RuntimeError(f"Secret {namespace}/{name} was taken and is gone")
    data = {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}
    ca, ca_key = data["ca.crt"], data["ca.key"]
    if covers(data["tls.crt"], hosts, now):
        return ServingCert(ca, data["tls.crt"], data["tls.key"])
    cert, key = sign(ca, ca_key, hosts, now)
    await kube.patch(_secret(namespace, name), {"data": {"tls.crt": base64.b64encode(cert).decode(),
                                                          "tls.key": base64.b64encode(key).decode()}})
    log.info("progress endpoint: a new serving certificate for %s in Secret %s/%s", ", ".join(hosts), namespace, name)
    return ServingCert(ca, cert, key)
