"""The version of this checkout: disttrain.__version__, read from its source (no import), so the
package, the chart (version and appVersion) and the operator image's tag are one number.
tests/unit/test_versions.py holds the chart and the CHANGELOG to it.

    python hack/version.py          # prints it
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "operator" / "disttrain" / "__init__.py"


def version() -> str:
    for node in ast.parse(SOURCE.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise RuntimeError(f"no __version__ in {SOURCE}")


VERSION = version()

if __name__ == "__main__":
    print(VERSION)
