"""The previous release, kept in the checkout: what the upgrade test installs first and upgrades from
(tests/e2e/test_chart_upgrade.py). hack/releases/v<version>.tar.gz is `git archive` of the tag's
chart, CRD, package source and operator Dockerfile; `make images` builds that operator image beside
this checkout's (as docker.io/disttrain/operator:<version>) and the plane's registry serves both.

It is an archive, not the tag itself, because a clone need not carry tags or history (a shallow CI
checkout), and a user upgrading installs a released chart, not a commit.

    python hack/releases.py snapshot v0.1.0   # at release time: write hack/releases/v0.1.0.tar.gz
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHIVES = REPO / "hack" / "releases"
PREVIOUS = "0.1.0"  # the release the upgrade test starts from
EXTRACTED = REPO / ".cache" / "releases"
# What the archive holds: enough to build the operator image (its Dockerfile copies pyproject.toml,
# README.md and operator/) and to install the chart and its CRD.
PATHS = ["pyproject.toml", "README.md", "operator", "images/operator", "charts/disttrain-operator", "crds"]


def archive(version: str = PREVIOUS) -> Path:
    return ARCHIVES / f"v{version}.tar.gz"


def source(version: str = PREVIOUS) -> Path:
    """The release's files, extracted once per archive content under .cache/releases."""
    path = archive(version)
    key = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    folder = EXTRACTED / f"v{version}-{key}"
    if not (folder / "pyproject.toml").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        with tarfile.open(path) as tar:
            tar.extractall(folder, filter="data")
    return folder


def chart(version: str = PREVIOUS) -> Path:
    return source(version) / "charts" / "disttrain-operator"


def snapshot(tag: str) -> Path:
    out = ARCHIVES / f"{tag}.tar.gz"
    with open(out, "wb") as f:
        git = subprocess.Popen(["git", "archive", "--format=tar", tag, *PATHS], cwd=REPO, stdout=subprocess.PIPE)
        subprocess.run(["gzip", "-9n"], stdin=git.stdout, stdout=f, check=True)
        if git.wait() != 0:
            raise SystemExit(f"git archive {tag} failed")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("snapshot", help="write hack/releases/<tag>.tar.gz from a git tag").add_argument("tag")
    args = parser.parse_args(argv)
    print(snapshot(args.tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
