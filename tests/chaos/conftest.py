"""The chaos suite (`make chaos`): scenarios whose purpose is to break the operator. Each is bounded
in time and stops by itself. The quick ones also run in `make test`; the long ones
(`@pytest.mark.chaos_full`) only when DISTTRAIN_CHAOS=full (`make chaos` sets it)."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos_full: a long chaos scenario, run by `make chaos` only")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DISTTRAIN_CHAOS") == "full":
        return
    skip = pytest.mark.skip(reason="a long chaos scenario: `make chaos` (DISTTRAIN_CHAOS=full) runs it")
    for item in items:
        if "chaos_full" in item.keywords:
            item.add_marker(skip)
