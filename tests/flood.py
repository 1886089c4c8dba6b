"""A connection flood against the progress endpoint, as any pod could send it (issue 31, item 1):
N connections that finish the TLS handshake (or not: `--no-handshake`), send half a request line
and wait; or (`--churn`) N at once that finish the handshake, close and start again, as fast as
the endpoint takes them (a handshake flood: CPU, not memory). Bounded in count and time; only
loopback or a test pod's own target is flooded.

    python tests/flood.py HOST PORT --connections 2500 --seconds 60 [--sources 127.0.0.2-50]

`--sources` spreads the connections over loopback source addresses (a flood from many pods);
it prints one JSON line at the end (or when sent SIGTERM): connections launched, opened, failed to
open (refused at accept, or the handshake cut), closed by the endpoint, and held open now.
Used by tests/unit/test_progress_process.py, tests/integration/test_progress_flood.py and
tests/chaos (make chaos).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import ssl
import sys
import time

HALF_A_LINE = b"POST /apis/disttrain.dev/v1/namespaces/x/disttrainjobs/y/prog"


def sources(spec: str | None) -> list[str | None]:
    if not spec:
        return [None]
    base, _, last = spec.rpartition("-")
    prefix, _, first = base.rpartition(".")
    return [f"{prefix}.{n}" for n in range(int(first), int(last) + 1)]


def unverified() -> ssl.SSLContext:
    """One client context for every connection. It was made per connection with
    ssl.create_default_context(), which loads the system's CA bundle: 25 ms of this process's event
    loop each on an idle 2-CPU machine, more under a test run's load. 400 of them kept the loop from
    every handshake past its 10 s timeout, and a CI run's flood opened no connection at all (stop 53:
    launched 400, failed 237, opened 0). A context that verifies nothing needs no CA bundle."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


async def one(host: str, port: int, source: str | None, context: ssl.SSLContext | None, until: float,
              tally: dict[str, int]) -> None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            host, port, ssl=context, local_addr=(source, 0) if source else None), 10)
    except (OSError, TimeoutError, ssl.SSLError):
        tally["failed"] += 1
        return
    tally["opened"] += 1
    tally["held"] += 1
    try:
        writer.write(HALF_A_LINE)
        left = until - time.monotonic()
        await asyncio.wait_for(reader.read(1), max(0.1, left))
        tally["closed"] += 1  # the endpoint ended it (or answered) before our time was up
    except TimeoutError:
        tally["to_the_end"] = tally.get("to_the_end", 0) + 1
    except (OSError, ssl.SSLError):
        tally["closed"] += 1
    finally:
        tally["held"] -= 1
        writer.transport.abort()


async def churn(host: str, port: int, source: str | None, context: ssl.SSLContext, until: float,
                tally: dict[str, int]) -> None:
    """TLS handshakes, one after another until `until`: each connection closed once made."""
    while time.monotonic() < until:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(
                host, port, ssl=context, local_addr=(source, 0) if source else None), 5)
        except (OSError, TimeoutError, ssl.SSLError):
            tally["failed"] += 1
            await asyncio.sleep(0)
            continue
        tally["opened"] += 1
        writer.transport.abort()


async def flood(host: str, port: int, connections: int, seconds: float, spread: list[str | None],
                handshake: bool, churning: bool = False) -> dict[str, int]:
    tally = {"opened": 0, "failed": 0, "closed": 0, "held": 0}
    launched = [0]
    until = time.monotonic() + seconds

    def told_to_stop() -> None:  # SIGTERM: the tally so far (held: open now), then out
        print(json.dumps({**tally, "launched": launched[0]}), flush=True)
        os._exit(0)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, told_to_stop)
    context = unverified()
    tasks = []
    for n in range(connections):
        source = spread[n % len(spread)]
        tasks.append(asyncio.create_task(churn(host, port, source, context, until, tally) if churning
                                         else one(host, port, source, context if handshake else None, until, tally)))
        launched[0] += 1
        if n % 100 == 99:
            await asyncio.sleep(0.05)  # the accept backlog, not a flood of SYNs dropped
    await asyncio.gather(*tasks)
    return {**tally, "launched": launched[0]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--connections", type=int, default=2500)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--sources", help="loopback source addresses, as 127.0.0.2-50")
    parser.add_argument("--no-handshake", action="store_true", help="bare TCP: never start TLS")
    parser.add_argument("--churn", action="store_true",
                        help="handshakes: each connection closed once made, and made again, until the end")
    args = parser.parse_args()
    assert args.connections <= 20_000 and args.seconds <= 600, "bounded: at most 20,000 connections, 10 minutes"
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tally = asyncio.run(flood(args.host, args.port, args.connections, args.seconds, sources(args.sources),
                              not args.no_handshake, args.churn))
    print(json.dumps(tally), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
