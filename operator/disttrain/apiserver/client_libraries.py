"""The Kubernetes client libraries the operator's two processes (the controller and the progress
endpoint) never use, kept out of them before kopf is imported.

kopf imports each one it finds installed (kopf/_cogs/helpers/thirdparty.py) to recognise its model
objects, which we never hand it, and would log in through the sync one. The light install puts
`kubernetes` there for the Python client. Measured: `import kopf` with both installed 92 MB RSS and
1,649 modules; without them 48 MB and 477 (issue 25's note). The endpoint's process set this after
its imports had run, and held them all: 94 MB resident idle, the larger of the operator's two
processes (issue 45).

Only for a process of the operator's own: a process that also runs the Python client (a test, a
notebook) needs `kubernetes`.
"""

from __future__ import annotations

import sys

CLIENT_LIBRARIES = ("kubernetes", "kubernetes_asyncio", "pykube")


def keep_out() -> None:
    for name in CLIENT_LIBRARIES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # an import then raises ImportError
