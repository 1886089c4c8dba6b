"""The local cluster's PKI: one CA signs the API server's serving cert, the admin's client cert,
and the real node's kubelet certs. EC keys are fast to make, so every cluster gets fresh ones."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "disttrain-local-ca")])
API_SERVER_NAMES = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local"]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def subject(common: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _cert(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer_key: ec.EllipticCurvePrivateKey, *,
          ca: bool = False, ips: Sequence[str] = (), dns: Sequence[str] = (),
          usage: Sequence[x509.ObjectIdentifier] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(CA_NAME)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(pki: Path, name: str, data: bytes) -> None:
    (pki / name).write_bytes(data)
    (pki / name).chmod(0o600)


def write_pki(pki: Path, server_ips: Sequence[str]) -> None:
    """The CA, the API server's cert (valid for `server_ips` and its in-cluster names), the admin
    client cert (system:masters) and the service-account signing key."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    _write(pki, "ca.crt", _cert(CA_NAME, ca_key, ca_key, ca=True).public_bytes(serialization.Encoding.PEM))
    _write(pki, "ca.key", _pem_key(ca_key))
    issue(pki, "apiserver", subject("kube-apiserver"), ips=server_ips, dns=API_SERVER_NAMES,
          usage=[ExtendedKeyUsageOID.SERVER_AUTH])
    issue(pki, "admin", subject("admin", "system:masters"), usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    sa_key = _key()
    _write(pki, "sa.key", _pem_key(sa_key))
    _write(pki, "sa.pub", sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))


def issue(pki: Path, name: str, subject: x509.Name, *, ips: Sequence[str] = (), dns: Sequence[str] = (),
          usage: Sequence[x509.ObjectIdentifier] = ()) -> None:
    """Sign `<name>.crt` / `<name>.key` in `pki` with the cluster's CA."""
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    _write(pki, f"{name}.crt", _cert(subject, key, ca_key, ips=ips, dns=dns, usage=usage)
           .public_bytes(serialization.Encoding.PEM))
    _write(pki, f"{name}.key", _pem_key(key))


def node_identity(pki: Path, node: str, ip: str) -> None:
    """The kubelet's client cert (the Node authorizer's system:node:<node>) and serving cert."""
    issue(pki, "kubelet-client", subject(f"system:node:{node}", "system:nodes"),
          usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    issue(pki, "kubelet-server", subject(node), ips=[ip], dns=[node], usage=[ExtendedKeyUsageOID.SERVER_AUTH])


def kubeconfig_text(server: str, pki: Path, user: str = "admin") -> str:
    """A kubeconfig for `server` as `user`, whose cert and key are `<user>.crt` / `<user>.key`."""
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "disttrain-local",
                      "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": user,
                   "user": {"client-certificate-data": b64(f"{user}.crt"), "client-key-data": b64(f"{user}.key")}}],
        "contexts": [{"name": "disttrain-local", "context": {"cluster": "disttrain-local", "user": user}}],
        "current-context": "disttrain-local",
    }
    return json.dumps(config, indent=2)
