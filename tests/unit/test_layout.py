"""The package stays readable: short modules with one job each, short functions."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "disttrain"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 300, 50


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_over_300_lines() -> None:
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in modules()}
    long = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES}
    assert not long


def test_no_function_over_50_lines() -> None:
    long = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = length
    assert not long


def test_every_module_lives_in_a_layer() -> None:
    """The tree shows the layers (README, Layout; the import-linter contract "The layers, top to
    bottom"): a new module goes into the folder of its layer, not beside them."""
    assert {p.name for p in PACKAGE.glob("*.py")} == {"__init__.py", "__main__.py"}
    layers = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert layers == {"api", "builders", "decide", "apiserver", "runtime", "control", "endpoint", "watch", "client"}


def test_test_modules_have_names_of_their_own() -> None:
    """tests/ has no __init__.py: pytest imports each test module by its file name alone, so two of one
    name in different folders stop `make test` at collection (tests/unit and tests/integration both had
    test_progress.py; `make unit` alone collected fine)."""
    tests = PACKAGE.parents[1] / "tests"
    seen: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
