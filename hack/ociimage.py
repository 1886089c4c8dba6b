"""Single-layer OCI image archives from a folder, without a registry or an image builder.

The local node needs two images no registry can give us here: the pod sandbox's `pause` and the
Debian base our Dockerfiles build FROM. Each is one filesystem layer; this writes it as an
`oci-archive` (the OCI image layout in a tar) that `ctr images import` and `buildah pull` read.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return f"sha256:{sha.hexdigest()}"


def write_oci_archive(rootfs: Path, out: Path, name: str, *, env: Sequence[str] = (),
                      cmd: Sequence[str] = (), entrypoint: Sequence[str] = ()) -> str:
    """Write `rootfs` as the one layer of image `name` (e.g. docker.io/disttrain/pause:3.10) to
    the archive `out`; returns the image's manifest digest."""
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        layer = Path(tmp) / "layer.tar"
        # GNU tar keeps owners numeric, device nodes, links and modes as they are in the folder.
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(layer), "."], check=True)
        layer_digest = _digest(layer)
        image_config: dict[str, Any] = {"Env": list(env) or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                                            "/usr/bin:/sbin:/bin"]}
        if cmd:
            image_config["Cmd"] = list(cmd)
        if entrypoint:
            image_config["Entrypoint"] = list(entrypoint)
        config = _blob({"architecture": "amd64", "os": "linux", "config": image_config,
                        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
                        "history": [{"created_by": f"disttrain hack/ociimage.py from {rootfs.name}"}]})
        manifest = _blob({"schemaVersion": 2, "mediaType": MANIFEST,
                          "config": {"mediaType": CONFIG, "digest": config[0], "size": len(config[1])},
                          "layers": [{"mediaType": LAYER, "digest": layer_digest, "size": layer.stat().st_size}]})
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
        index = {"schemaVersion": 2, "manifests": [{
            "mediaType": MANIFEST, "digest": manifest[0], "size": len(manifest[1]),
            "annotations": {"org.opencontainers.image.ref.name": tag, "io.containerd.image.name": name}}]}
        partial = out.with_suffix(".partial")
        with tarfile.open(partial, "w") as archive:
            _add_bytes(archive, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            _add_bytes(archive, "index.json", json.dumps(index).encode())
            for digest, data in (config, manifest):
                _add_bytes(archive, f"blobs/sha256/{digest.removeprefix('sha256:')}", data)
            archive.add(layer, f"blobs/sha256/{layer_digest.removeprefix('sha256:')}")
        partial.rename(out)
        return manifest[0]


def _blob(document: Mapping[str, Any]) -> tuple[str, bytes]:
    data = json.dumps(document, separators=(",", ":")).encode()
    return f"sha256:{hashlib.sha256(data).hexdigest()}", data


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def archive_manifest(archive: Path) -> dict[str, Any]:
    """The image's entry in an OCI archive's index.json (ours, or buildah's `oci-archive:`): its
    digest and annotations."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        return dict(json.load(member)["manifests"][0])
