"""The real node's DRA kubelet plugin (hack/nodedra.py, issue 35): the bound it states on its socket
paths holds before anything is asked of the plane, and the plugin is told the node by flag and by
environment (its CDI spec reads the latter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import nodedra


class NoPlane:
    root = Path("/nonexistent")

    def spawn(self, name: str, argv: list[str]) -> None:
        raise AssertionError("nothing may start")

    def wait(self, what: str, ready: Any, deadline: float, interval: float = 0.2) -> None:
        raise AssertionError("nothing may be waited for")

    def api(self, method: str, path: str, body: Any = None, *, allow_missing: bool = False,
            content_type: str = "application/json") -> Any:
        raise AssertionError(f"no request: {method} {path}")


def test_socket_paths_past_the_unix_bound_fail_naming_them_before_any_request(tmp_path: Path) -> None:
    suffix = max(len(str(s)) for s in nodedra.sockets(Path("/")))  # "/plugins_registry/...-reg.sock"
    at_bound = Path("/" + "k" * (nodedra.SOCKET_PATH_MAX - suffix - 1))  # "/kk..." + the suffix: the bound
    assert max(len(str(s)) for s in nodedra.sockets(at_bound)) == nodedra.SOCKET_PATH_MAX
    over = Path(str(at_bound) + "k")  # one byte past it
    with pytest.raises(RuntimeError, match=r"longer than 107 bytes.*plugins_registry.*clone the repository"):
        nodedra.start(NoPlane(), Path("/bin/true"), tmp_path, over, "real-node-0", tmp_path / "cdi", 0.0)


def test_the_plugin_is_told_its_node_by_flag_and_environment() -> None:
    argv = nodedra.argv(Path("/bin/plugin"), Path("/k"), "real-node-0", Path("/kubelet"), Path("/cdi"))
    assert argv[:3] == ["env", "NODE_NAME=real-node-0", "/bin/plugin"]
    assert {"--node-name=real-node-0", "--cdi-root=/cdi", "--num-devices=8",
            "--kubelet-registrar-directory-path=/kubelet/plugins_registry",
            "--kubelet-plugins-directory-path=/kubelet/plugins"} <= set(argv)
