"""A fresh SSH key pair for one MPI job: the one impure part of MPI's objects (mpi.py builds the
rest from it). Apart, so that what builds a job's objects, and `disttrain render`, need no
`cryptography`: the light install (`pip install .`) leaves it out (only the `[operator]` extra has it)."""

from __future__ import annotations

from disttrain.builders.mpi import SSHKeys


def generate_ssh_keys(comment: str) -> SSHKeys:
    """Called once per job by the controller. cryptography is imported here, at the first MPI
    job: an operator running none idles without OpenSSL's bindings (7.7 MB of RSS, measured)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return SSHKeys(private=private, public=f"{public} {comment}")
