"""`make images`: the project's images, built here without a registry or a Docker engine.

1. a Debian bookworm base with Python 3.11 and pip, made by debootstrap from Debian's mirror
   (what `python:3.11-slim-bookworm` gives a `docker build`);
2. images/{operator,tensorflow,horovod}/Dockerfile built by buildah, unchanged but for
   `--build-arg BASE_IMAGE=<that base>`;
3. the pod sandbox's `pause` (hack/node/pause.c, static).

Each lands in .cache/images/<name>.tar (an OCI archive), which the real node imports into
containerd (hack/realnode.py). Everything is cached by content: an image is rebuilt only when its
Dockerfile, the files it copies, its build arguments or its base change.

pip inside the builds sees a local wheelhouse first (a mounted /etc/pip.conf with find-links): the
same wheels the test venvs installed (TensorFlow, tf-keras) and the Horovod wheel `make mpi-e2e`
built against this same Debian's Open MPI. A `docker build` without it downloads and compiles
them instead; the result is the same.

    python hack/images.py [--only tensorflow,operator]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import releases
from ociimage import write_oci_archive
from version import VERSION

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
OUT = CACHE / "images"
WHEELS = CACHE / "wheels"
BUILDAH = ["buildah", "--root", str(CACHE / "buildah"), "--runroot", "/run/disttrain-buildah",
           "--storage-driver", "overlay"]
BASE = "localhost/disttrain/debian-python:bookworm"
BASE_PACKAGES = ["python3", "python3-pip", "python3-dev", "python-is-python3", "ca-certificates"]
DEBIAN_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class Image:
    name: str  # its archive: .cache/images/<name>.tar
    ref: str
    wheels: tuple[str, ...] = ()  # pip requirements put in the wheelhouse for its build
    folder: str = ""  # images/<folder>/Dockerfile; the name if empty
    context: Path = REPO  # the build's context: this checkout, or a release's files (hack/releases.py)
    # Built FROM that image of this list (its BASE_IMAGE), not the Debian base: tensorflow on
    # plain-tensorflow, whose layers are tensorflow's first steps; tensorflow's own pip step then
    # finds TensorFlow installed (its Dockerfile, unchanged, is what a user builds on any base).
    # Saves a new machine's second TensorFlow install: ~90 s of `make test`'s node lane.
    on: str = ""

    @property
    def dockerfile(self) -> Path:
        return self.context / "images" / (self.folder or self.name) / "Dockerfile"


IMAGES = [
    Image("operator", f"docker.io/disttrain/operator:{VERSION}"),
    # The previous release's operator, built from its own files: the upgrade test starts from it.
    Image(f"operator-{releases.PREVIOUS}", f"docker.io/disttrain/operator:{releases.PREVIOUS}", folder="operator",
          context=releases.source()),
    # TensorFlow with nothing of ours, for the test of the progress hook in any image; and the base of
    # our TensorFlow image.
    Image("plain-tensorflow", "docker.io/disttrain-test/plain-tensorflow:2.21",
          ("tensorflow-cpu==2.21.0", "tf-keras==2.21.0")),
    Image("tensorflow", "docker.io/disttrain/tensorflow:2.21", ("tensorflow-cpu==2.21.0", "tf-keras==2.21.0"),
          on="plain-tensorflow"),
    Image("horovod", "docker.io/disttrain/horovod:0.28.1", ("tensorflow-cpu==2.15.1", "horovod==0.28.1")),
]
BY_NAME = {image.name: image for image in IMAGES}
BASES = {image.on for image in IMAGES if image.on}  # kept in buildah's storage until every build is done


# buildah writes each layer it commits to a temporary file first, in /var/tmp unless TMPDIR says
# otherwise; CI's /var/tmp ran out of space committing the Horovod image ("writing blob: ... write
# /var/tmp/storage1216923303/1: no space left on device"), so those files live beside the cache.
BUILDAH_TMP = CACHE / "buildah-tmp"


def sh(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    if argv[0] == "buildah":
        BUILDAH_TMP.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("env", {**os.environ, "TMPDIR": str(BUILDAH_TMP)})
    return subprocess.run(argv, check=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def digest_of(*parts: str | Path) -> str:
    """A digest of strings and files (folders: every file under them, by path and content)."""
    sha = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = sorted(p for p in part.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
                if part.is_dir() else [part]
            for f in files:
                sha.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
        else:
            sha.update(part.encode() + b"\0")
    return sha.hexdigest()[:16]


def up_to_date(name: str, key: str) -> bool:
    stamp = OUT / f"{name}.key"
    return stamp.exists() and stamp.read_text() == key and (OUT / f"{name}.tar").exists()


def record(name: str, key: str, started: float) -> None:
    (OUT / f"{name}.key").write_text(key)
    size = (OUT / f"{name}.tar").stat().st_size
    print(f"images: {name} built in {time.monotonic() - started:.0f}s, {size / 2**20:.0f} MiB", flush=True)


def pause() -> None:
    source = REPO / "hack" / "node" / "pause.c"
    key = digest_of(source)
    if up_to_date("pause", key):
        return
    started = time.monotonic()
    root = OUT / "work" / "pause"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    sh("gcc", "-static", "-O2", "-s", "-o", str(root / "pause"), str(source))
    write_oci_archive(root, OUT / "pause.tar", "docker.io/disttrain/pause:3.10", entrypoint=["/pause"])
    record("pause", key, started)


def base() -> str:
    """The Debian base in buildah's storage; returns its key (a change rebuilds every image)."""
    key = digest_of("bookworm", DEBIAN_MIRROR, *BASE_PACKAGES)
    present = subprocess.run([*BUILDAH, "inspect", "--type", "image", BASE], capture_output=True).returncode == 0
    if up_to_date("base", key) and present:
        return key
    started = time.monotonic()
    if not up_to_date("base", key):
        rootfs = OUT / "work" / "base"
        shutil.rmtree(rootfs, ignore_errors=True)
        sh("debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", str(rootfs),
           DEBIAN_MIRROR, stdout=subprocess.DEVNULL)
        # What python:3.11-slim allows: `pip install` into the image's Python (PEP 668 marker off),
        # and no package lists baked in.
        for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        shutil.rmtree(rootfs / "var" / "lib" / "apt" / "lists", ignore_errors=True)
        (rootfs / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True)
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        write_oci_archive(rootfs, OUT / "base.tar", BASE, env=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                                               "/usr/bin:/sbin:/bin", "LANG=C.UTF-8"])
        shutil.rmtree(rootfs)
    image_id = sh(*BUILDAH, "pull", "--quiet", f"oci-archive:{OUT / 'base.tar'}", capture_output=True).stdout
    sh(*BUILDAH, "tag", image_id.strip().splitlines()[-1], BASE)
    record("base", key, started)
    return key


def wheelhouse(image: Image) -> Path:
    """The wheels pip inside the build finds first: downloaded (from pip's cache, after the test
    venvs) or, for Horovod, the one hack/mpi-e2e/build-hvd-venv.sh built against this Debian's
    Open MPI for the test venv (`make mpi-e2e`)."""
    house = WHEELS / image.name
    house.mkdir(parents=True, exist_ok=True)
    pip = [str(CACHE / ("hvd-venv" if image.name == "horovod" else "tf-venv") / "bin" / "python"), "-m", "pip", "-q"]
    for wheel in (w for w in image.wheels if not w.startswith("horovod")):
        # tf-keras as its Dockerfile installs it: without dependencies (see images/tensorflow).
        no_deps = ["--no-deps"] if wheel.startswith("tf-keras") else []
        sh(*pip, "download", "--only-binary=:all:", *no_deps, "-d", str(house), wheel)
    if any(w.startswith("horovod") for w in image.wheels) and not list(house.glob("horovod-*.whl")):
        raise SystemExit(f"images: no Horovod wheel in {house}: `make mpi-e2e` builds it (with MPI and Gloo)")
    return house


# A full disk shows up in buildah's commit as "io: read/write on closed pipe", not as ENOSPC (CI, the
# TensorFlow image, with the machine's disk nearly full): a failed build says how much space was left.
LOW_SPACE = 3 * 2**30


def free_space_report() -> str:
    free = shutil.disk_usage(CACHE).free
    verdict = " (likely too little: a commit holds the layer about three times over, and Horovod's is 0.7 GiB)" \
        if free < LOW_SPACE else ""
    return f"{free / 2**30:.1f} GiB free under {CACHE}{verdict}"


def host_ca_bundle() -> Path:
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise RuntimeError("no CA bundle found for pip inside the image builds")


def build(image: Image, base_key: str) -> None:
    dockerfile = image.dockerfile
    copied = [image.context / src for line in dockerfile.read_text().splitlines() if line.startswith("COPY ")
              for src in line.split()[1:-1]]
    base_ref = BASE
    if image.on:  # built on another image of ours: its key stands for the base's
        base_key, base_ref = (OUT / f"{image.on}.key").read_text(), BY_NAME[image.on].ref
    key = digest_of(base_key, image.ref, *image.wheels, "format=docker", dockerfile, *copied)
    if up_to_date(image.name, key):
        return
    if image.on and subprocess.run([*BUILDAH, "inspect", "--type", "image", base_ref],
                                   capture_output=True).returncode != 0:
        # Built by an earlier run: back into buildah's storage from its archive.
        sh(*BUILDAH, "pull", "--quiet", f"oci-archive:{OUT / image.on}.tar", stdout=subprocess.DEVNULL)
    started = time.monotonic()
    # pip in the build trusts what this machine trusts (its HTTPS egress may present a CA of its
    # own) and looks in the wheelhouse first; both are mounted for the build only, never kept.
    pip_conf = OUT / "work" / "pip.conf"
    pip_conf.parent.mkdir(parents=True, exist_ok=True)
    pip_conf.write_text("[global]\ncert = /etc/disttrain-build-ca.crt\n"
                        + ("find-links = /wheels\n" if image.wheels else ""))
    mounts = ["--volume", f"{pip_conf}:/etc/pip.conf:ro",
              "--volume", f"{host_ca_bundle()}:/etc/disttrain-build-ca.crt:ro"]
    if image.wheels:
        mounts += ["--volume", f"{wheelhouse(image)}:/wheels:ro"]
    # Docker's image format: the OCI format has no SHELL, and buildah would run RUN steps with
    # /bin/sh instead of the Dockerfiles' `bash -o pipefail`.
    try:
        sh(*BUILDAH, "bud", "--quiet", "--format", "docker", "--isolation", "chroot", "--pull-never",
           "--build-arg", f"BASE_IMAGE={base_ref}",
           *mounts, "-f", str(dockerfile), "-t", image.ref, str(image.context), stdout=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        print(f"images: building {image.name} failed; {free_space_report()}", file=sys.stderr, flush=True)
        raise
    archive = OUT / f"{image.name}.tar"
    archive.unlink(missing_ok=True)
    sh(*BUILDAH, "push", "--quiet", "--format", "oci", "--disable-compression", image.ref,
       f"oci-archive:{archive}:{image.ref}")
    # The archive is the image from now on: buildah's copy (2 GiB for Horovod) would only double
    # the disk a clone needs (the base stays: the next build starts FROM it).
    if image.name not in BASES:  # a base stays for the image built on it; main() removes it
        remove(image.ref)
    record(image.name, key, started)


def remove(ref: str) -> None:
    """The image out of buildah's storage, and the layers only it used; nothing when it is not there
    (a base that every image built on was up to date: main() asks for each base at every run)."""
    if subprocess.run([*BUILDAH, "rmi", ref], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                      env={**os.environ, "TMPDIR": str(BUILDAH_TMP)}).returncode == 0:
        sh(*BUILDAH, "rmi", "--prune", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated image names (default: all)")
    args = parser.parse_args(argv)
    only = {n for n in args.only.split(",") if n}
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pause()
    base_key = base()
    only |= {BY_NAME[name].on for name in only if name in BY_NAME and BY_NAME[name].on}  # its base: its key
    for image in IMAGES:
        if not only or image.name in only:
            build(image, base_key)
    for name in BASES:
        remove(BY_NAME[name].ref)
    shutil.rmtree(OUT / "work", ignore_errors=True)
    shutil.rmtree(BUILDAH_TMP, ignore_errors=True)
    print(f"images: ready in {OUT} ({time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
