"""The local plane's image registry: CNCF Distribution (`registry`, built from its module by
hack/build-binaries.sh) serving HTTPS with a cert of the plane's CA and htpasswd auth, as a
platform team's registry would. The real node's containerd pulls every image of a job and of the
operator from it, with the credentials of a pull secret (kubelet hands containerd the secret a pod
names, or its ServiceAccount's); nothing else is imported into the node but the pod sandbox.

`make push REGISTRY=host[:port]/path` pushes the images `make images` built to any registry, with
crane (go-containerregistry, built likewise), and prints their digests:

    python hack/registry.py push --registry 10.89.0.1:5443/disttrain-ci   # the docker config in
                                                                          # $DOCKER_CONFIG logs in

The registry's storage (.cache/registry) outlives the plane, so a push sends only new layers, and a
pushed image whose digest the registry has is not sent again.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import bcrypt
from cryptography.x509.oid import ExtendedKeyUsageOID

import pki
import releases
from ociimage import archive_manifest
from version import VERSION

REPO = Path(__file__).resolve().parent.parent
BIN_DIR = Path(os.environ.get("DISTTRAIN_BIN_ROOT", REPO / ".cache" / "bin"))
IMAGE_ARCHIVES = REPO / ".cache" / "images"
STORAGE = REPO / ".cache" / "registry"
# The registry listens on the real node's bridge address, the node's own network, as a cluster's
# registry is reached from its nodes. A fixed port below free_port's range (ports.py), so image
# names are the same in every run: tests and examples name 10.89.0.1:5443/disttrain/...
HOST = "10.89.0.1"
PORT = 5443
ADDRESS = f"{HOST}:{PORT}"
USER = "disttrain-ci"
# The images `make images` builds (hack/images.py), by archive: what `make push` sends and where.
PUSHED = {"operator": f"disttrain/operator:{VERSION}", "tensorflow": "disttrain/tensorflow:2.21",
          "horovod": "disttrain/horovod:0.28.1"}
OPERATOR = PUSHED["operator"]
# The previous release's operator (hack/releases.py), which the upgrade test installs first. Only the
# local registry gets it and the next: `make push` to yours sends this checkout's images.
PREVIOUS_OPERATOR = f"disttrain/operator:{releases.PREVIOUS}"
PREVIOUS_ARCHIVE = f"operator-{releases.PREVIOUS}"
# TensorFlow with nothing of disttrain's (images/plain-tensorflow), for the hook-in-any-image test; local only too.
PLAIN_TENSORFLOW = "disttrain-test/plain-tensorflow:2.21"
LOCAL_ONLY = {PREVIOUS_ARCHIVE: PREVIOUS_OPERATOR, "plain-tensorflow": PLAIN_TENSORFLOW}
PULL_SECRET = "disttrain-registry"  # the Secret each of the plane's namespaces that pulls gets


def local(ref: str) -> str:
    """`disttrain/tensorflow:2.21` as the local registry serves it."""
    return f"{ADDRESS}/{ref}"


class Registry:
    """The registry of the plane rooted at `root`: its config, cert and credentials live in
    <root>/registry (fresh with each plane), its blobs in STORAGE (kept)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "registry"
        self.pki = root / "pki"

    @property
    def password(self) -> str:
        return (self.dir / "password").read_text()

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def docker_config(self) -> Path:
        """A DOCKER_CONFIG folder logging crane (and anything else reading it) in."""
        return self.dir / "docker"

    def start(self, spawn: Any, wait: Any, deadline: float) -> None:
        """Write the cert, htpasswd file and config, and start it with `spawn(name, argv)`."""
        self.dir.mkdir(parents=True, exist_ok=True)
        STORAGE.mkdir(parents=True, exist_ok=True)
        pki.issue(self.pki, "registry", pki.subject("disttrain-registry"), ips=[HOST, "127.0.0.1"],
                  dns=["localhost"], usage=[ExtendedKeyUsageOID.SERVER_AUTH])
        password = secrets.token_urlsafe(24)
        _write_private(self.dir / "password", password)
        # Distribution's htpasswd reads bcrypt only. A low cost: every request checks it.
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()
        _write_private(self.dir / "htpasswd", f"{USER}:{hashed}\n")
        self.docker_config.mkdir(exist_ok=True)
        _write_private(self.docker_config / "config.json", json.dumps(docker_config(ADDRESS, USER, password)))
        config = self.dir / "config.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": False}, "formatter": "text"},
            "storage": {"filesystem": {"rootdirectory": str(STORAGE)}, "delete": {"enabled": True}},
            "http": {"addr": ADDRESS, "secret": secrets.token_hex(16),
                     "tls": {"certificate": str(self.pki / "registry.crt"), "key": str(self.pki / "registry.key")}},
            "auth": {"htpasswd": {"realm": "disttrain-local", "path": str(self.dir / "htpasswd")}},
        }, indent=2))
        # What an earlier plane pushed and a later push untagged (each rebuilt operator image) goes, so the
        # storage kept across planes holds the images as they are now, not every build of them.
        collected = subprocess.run([str(BIN_DIR / "registry"), "garbage-collect", "--delete-untagged", str(config)],
                                   capture_output=True, text=True, timeout=300)
        (self.dir / "garbage-collect.log").write_text(collected.stdout + collected.stderr)
        spawn("registry", [str(BIN_DIR / "registry"), "serve", str(config)])
        wait("the image registry answering", lambda: answers(self.ca), deadline)

    @property
    def crane_env(self) -> dict[str, str]:
        """crane logged in (DOCKER_CONFIG) and trusting the plane's CA (Go reads SSL_CERT_FILE)."""
        return {**os.environ, "DOCKER_CONFIG": str(self.docker_config), "SSL_CERT_FILE": str(self.ca)}

    def push_all(self) -> dict[str, str]:
        """Every image `make images` built, to this registry (skipping what it has)."""
        return push_archives(ADDRESS, self.crane_env, {**PUSHED, **LOCAL_ONLY})

    def tag(self, ref: str, tag: str) -> str:
        """A new tag for an image the registry has (no layer moves); the new reference."""
        crane("tag", local(ref), tag, env=self.crane_env)
        return f"{local(ref).rsplit(':', 1)[0]}:{tag}"

    def pull_secret(self, namespace: str) -> dict[str, Any]:
        return pull_secret(namespace, ADDRESS, USER, self.password)

    @staticmethod
    def helm_values() -> list[str]:
        """`helm install`'s flags for the chart's operator to be pulled from here: the registry, and
        the pull secret the release's namespace gets from namespace_pulls."""
        return ["--set", f"image.registry={ADDRESS}", "--set", f"imagePullSecrets[0].name={PULL_SECRET}"]

    def namespace_pulls(self, namespace: str) -> dict[str, Any]:
        """The pull secret and the default ServiceAccount naming it, as one List for `kubectl apply
        --server-side` (which creates the ServiceAccount if its controller hasn't yet)."""
        return {"apiVersion": "v1", "kind": "List",
                "items": [self.pull_secret(namespace), default_service_account(namespace)]}


def from_local_registry(doc: Any) -> Any:
    """`doc` (a manifest) with every `image: disttrain/...` named as the local registry serves it:
    what a user edits in an example before applying it to a cluster of their own."""
    if isinstance(doc, dict):
        return {k: local(v) if k == "image" and isinstance(v, str) and v.startswith("disttrain/")
                else from_local_registry(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [from_local_registry(v) for v in doc]
    return doc


def _write_private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


def docker_config(registry: str, user: str, password: str) -> dict[str, Any]:
    """The `auths` of a docker config.json: what crane reads and what a pull secret holds."""
    return {"auths": {registry: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}


def pull_secret(namespace: str, registry: str, user: str, password: str) -> dict[str, Any]:
    """A kubernetes.io/dockerconfigjson Secret for `registry`, as `kubectl create secret
    docker-registry` makes it."""
    config = json.dumps(docker_config(registry, user, password))
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": PULL_SECRET, "namespace": namespace},
            "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()}}


def default_service_account(namespace: str) -> dict[str, Any]:
    """The namespace's default ServiceAccount naming the pull secret: the ServiceAccount admission
    plugin copies it into every pod of the namespace that names none (a platform team's usual way)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": namespace},
            "imagePullSecrets": [{"name": PULL_SECRET}]}


def answers(ca: Path) -> bool:
    """Whether the registry answers /v2/ over TLS (401 without credentials is an answer)."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(f"https://{ADDRESS}/v2/", context=context, timeout=2):
            return True
    except urllib.error.HTTPError as err:
        err.close()
        return err.code == 401
    except (urllib.error.URLError, OSError):
        return False


def crane(*argv: str, env: dict[str, str]) -> str:
    """crane's output; its log (a line per blob) only when it fails, in the error."""
    done = subprocess.run([str(BIN_DIR / "crane"), *argv], env=env, text=True, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"crane {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def push_archives(registry: str, env: dict[str, str], images: dict[str, str] = PUSHED) -> dict[str, str]:
    """Push each image archive (`images`: archive name to reference) to `registry` (host[:port][/path]);
    its digest by reference. An image the registry already has at that reference, by digest, is not
    sent again."""
    pushed: dict[str, str] = {}
    for name, ref in images.items():
        archive = IMAGE_ARCHIVES / f"{name}.tar"
        if not archive.exists():
            raise SystemExit(f"push: no {archive}: `make images` builds it")
        dest, digest = f"{registry}/{ref}", str(archive_manifest(archive)["digest"])
        there = subprocess.run([str(BIN_DIR / "crane"), "digest", dest], env=env, text=True,
                               capture_output=True)
        if there.returncode != 0 or there.stdout.strip() != digest:
            # crane pushes an OCI layout folder (a file would be read as `docker save`'s tarball).
            with tempfile.TemporaryDirectory(dir=IMAGE_ARCHIVES) as layout:
                with tarfile.open(archive) as tar:
                    tar.extractall(layout, filter="data")
                crane("push", layout, dest, env=env)
        pushed[dest] = digest
    return pushed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    push = sub.add_parser("push", help="push the images to a registry and print their digests")
    push.add_argument("--registry", default="", help="host[:port][/path] (default: the local plane's)")
    push.add_argument("--cluster-dir", type=Path, default=REPO / ".cache" / "cluster")
    args = parser.parse_args(argv)
    registry = args.registry
    env = dict(os.environ)
    if not registry:
        local_registry = Registry(args.cluster_dir)
        if not (local_registry.dir / "password").exists():
            raise SystemExit("push: no REGISTRY given and no local plane's registry (make cluster-up REAL_NODE=1)")
        registry, env = ADDRESS, local_registry.crane_env
    if not (BIN_DIR / "crane").exists():
        raise SystemExit(f"push: no crane in {BIN_DIR}: `hack/build-binaries.sh crane` builds it (make push does)")
    started = time.monotonic()
    try:
        pushed = push_archives(registry, env)
    except RuntimeError as err:  # crane's own words: no credentials, a CA this machine doesn't trust, ...
        print(f"push: {err}", file=sys.stderr)
        return 1
    for ref, digest in pushed.items():
        print(f"{ref}@{digest}")
    print(f"pushed in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
