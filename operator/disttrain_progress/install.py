"""Put `disttrain_progress` and its zero-code Keras hook into a folder any Python picks up: what the
operator's init container runs (from the operator's image) for a pod whose image has none of it.

    python -m disttrain_progress.install /var/run/disttrain.dev/hook

The folder becomes the training containers' PYTHONUSERBASE (read-only there): Python's `site` adds
<folder>/lib/python3.X/site-packages at start-up, before the image's own site-packages, and runs
the `.pth` file written there for each Python 3 minor version, which

1. puts <folder>/lib (this package) on sys.path, unless the image has disttrain_progress in its
   site-packages (our images): then that copy, the image's own, is the one that runs;
2. adds back the user site-packages PYTHONUSERBASE displaced (~/.local/lib/python3.X/site-packages),
   so a `pip install --user` in the image still counts;
3. imports `disttrain_progress.startup` inside a job's pod, as the images' own `.pth` does, if this
   copy is the one on sys.path.

The image's PYTHONPATH and sitecustomize are left as they are: nothing here replaces them. A Python
that skips the user site doesn't load it: a virtualenv made without --system-site-packages,
`python -s`, PYTHONNOUSERSITE (docs/api.md, "The hook in any image").

Standard library only, so the init container needs nothing but Python.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# python3.9 .. python3.15, one .pth each (the folder name carries the version): the package needs 3.9, and
# an older Python finds no .pth to fail on.
MINORS = range(9, 16)
# A .pth file runs a line that starts with "import", one line each: no wrapping.
# 1. This package on sys.path, unless the image's site-packages has its own (our images' disttrain.pth, or
#    a pip-installed disttrain_progress): then the image's copy is the one imported, and it starts itself.
OURS_UNLESS_THE_IMAGES = ('import os, site, sys; any(os.path.exists(os.path.join(d, n)) '
                          'for d in site.getsitepackages() for n in ("disttrain.pth", "disttrain_progress")) '
                          'or sys.path.append({lib!r})')
# 2. The user site-packages PYTHONUSERBASE displaced (~/.local), where a home is known.
USER_SITE_BACK = ('import os, site, sys; os.path.expanduser("~") != "~" and site.addsitedir(os.path.join('
                  'os.path.expanduser("~"), ".local", "lib", "python%d.%d" % sys.version_info[:2], "site-packages"))')
# 3. The hook started, if this copy is the one on sys.path.
STARTED_IF_OURS = "import os, sys; {lib!r} in sys.path and {hook}"


# The images' own .pth import line (disttrain.pth's second line; a unit test holds them equal): both
# start the hook alike. Written here too: a pip-installed package has no disttrain.pth.
HOOK_LINE = ('import os; (os.environ.get("DISTTRAIN_CHECKPOINT_DIR") or os.environ.get("DISTTRAIN_PROGRESS_DIR")) '
             'and os.environ.get("DISTTRAIN_KERAS_HOOK", "1") != "0" and __import__("disttrain_progress.startup")')


def install(folder: Path) -> None:
    lib = folder / "lib"
    target = lib / PACKAGE.name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pth"))
    pth = "\n".join([OURS_UNLESS_THE_IMAGES.format(lib=str(lib)), USER_SITE_BACK,
                     STARTED_IF_OURS.format(lib=str(lib), hook=HOOK_LINE.removeprefix("import os; "))]) + "\n"
    for minor in MINORS:
        site_packages = lib / f"python3.{minor}" / "site-packages"
        site_packages.mkdir(parents=True, exist_ok=True)
        (site_packages / "disttrain.pth").write_text(pth)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python -m disttrain_progress.install FOLDER", file=sys.stderr)
        return 2
    install(Path(args[0]))
    print(f"disttrain_progress installed in {args[0]} (PYTHONUSERBASE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
