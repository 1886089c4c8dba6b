"""Free loopback ports, and whether a component's health endpoint answers on one, for the local
plane's components and the tests' processes."""

import os
import random
import socket
import ssl
import urllib.error
import urllib.request

_GIVEN: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _range() -> tuple[int, int]:
    """The ports this process draws from: below the kernel's ephemeral range, or the share of it
    DISTTRAIN_PORTS=<low>-<high> names (hack/testlanes.py gives each lane of `make test` its own, so
    two lanes' planes never pick the same port between one's check and its server's bind)."""
    low, high = 10000, max(10001, _ephemeral_low())
    share = os.environ.get("DISTTRAIN_PORTS", "")
    if share:
        first, _, last = share.partition("-")
        low, high = int(first), min(int(last), high)  # never into the ephemeral range
    return low, high


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range. A port the kernel picked (bind to 0) is
    one of that range, which every outgoing connection draws its local port from: between this call
    and the server's bind, one of the plane's thousands of connections took it ('Address already in
    use', seen in a clean-clone make test once the progress endpoint bound a few seconds later)."""
    low, high = _range()
    for _ in range(1000):
        port = random.randrange(low, high)
        if port in _GIVEN:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as sock:  # nothing free below the range: as before
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


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
