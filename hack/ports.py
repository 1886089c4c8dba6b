"""Free loopback ports, and whether a component's health endpoint answers on one, for the local
plane's components and the tests' processes."""

import socket
import ssl
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    """Whether `url` answers 200 now (a server not listening yet, or answering 503, is not)."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError as err:  # up, not ready yet (503); close its connection
        err.close()
    except (urllib.error.URLError, ConnectionError, OSError):
        pass
    return False
