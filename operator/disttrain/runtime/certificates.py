"""The progress endpoint's certificates, made and checked with `cryptography`, in a process of
their own: `python -m disttrain.runtime.certificates` reads what a Secret holds and the hosts
(JSON on stdin) and answers what the Secret should hold now (JSON on stdout; null: keep it).
The operator runs it once at start-up (runtime/serving_cert.py), so that `cryptography`'s
8 MB never stay in its memory (idle RSS, `make bench`); its keys cross a pipe, never a disk.

A CA of the operator's own (P-256; ten years) and a serving certificate it signs (one year),
renewed when it doesn't name the host the pods are told or has less than a month left.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import sys
from collections.abc import Mapping, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_YEARS, CERT_DAYS, RENEW_DAYS = 10, 365, 30


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


def renewed(data: Mapping[str, bytes] | None, hosts: Sequence[str],
            now: datetime.datetime) -> dict[str, bytes] | None:
    """What the Secret should hold (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`): all new when there
    is none, a new serving certificate when its one doesn't cover `hosts`; None to keep it."""
    if data is None:
        ca, ca_key = new_ca(now)
        cert, key = sign(ca, ca_key, hosts, now)
        return {"ca.crt": ca, "ca.key": ca_key, "tls.crt": cert, "tls.key": key}
    if covers(data["tls.crt"], hosts, now):
        return None
    cert, key = sign(data["ca.crt"], data["ca.key"], hosts, now)
    return {**data, "tls.crt": cert, "tls.key": key}


def main() -> None:
    asked = json.load(sys.stdin)
    data = asked["data"] and {k: base64.b64decode(v) for k, v in asked["data"].items()}
    made = renewed(data, asked["hosts"], datetime.datetime.fromisoformat(asked["now"]))
    json.dump(made and {k: base64.b64encode(v).decode() for k, v in made.items()}, sys.stdout)


if __name__ == "__main__":
    main()
