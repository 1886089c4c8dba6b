"""The one channel between the controller and the progress endpoint's process: a Unix socket pair,
one JSON object a line, each side's lines bounded (MAX_LINE) and answered in order.

    endpoint -> controller  {"id": 7, "identity": {"namespace", "pod", "podUID"}, "job": [ns, name], "report": {...}}
                            {"counts": {"accepted": 3, "unauthenticated": 120}, "connections": {...}}
    controller -> endpoint  {"id": 7, "status": 202, "result": "accepted", "message": "..."}
                            {"cert": {"ca": PEM, "cert": PEM, "key": PEM}}

Bounded on both sides: the endpoint has at most MAX_PENDING questions out (past them a report is
answered 503 at once) and waits ANSWER_TIMEOUT for each; the controller reads one line at a time
and waits for the endpoint to take its answers before it reads the next (`drain`), so a stalled
endpoint stalls its own questions, never the controller. A line the controller can't read ends
the link, and the endpoint's process with it (progress_supervisor.py starts another).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

MAX_KEYS = 256  # in one JSON object of a line (_bounded_object)
MAX_LINE = 64 * 1024  # a report is at most 16 KiB; its JSON inside a line at most ~6x that in escapes
MAX_PENDING = 64
ANSWER_TIMEOUT = 5.0
BUSY = "the operator is busy: try again shortly"


JobKey = tuple[str, str]


@dataclass(frozen=True)
class Identity:
    """The pod a reviewed token is bound to; `until` (monotonic) its review stands, `expires` the
    token does (the endpoint's own: neither goes over the link)."""

    namespace: str
    pod: str
    pod_uid: str
    until: float
    expires: float = math.inf


class Refused(Exception):
    """A report's answer other than 202, on either side of the link."""

    def __init__(self, status: int, result: str, message: str, retry_after: float | None = None,
                 throttled: str | None = None) -> None:
        super().__init__(message)
        self.status, self.result, self.message, self.retry_after = status, result, message, retry_after
        self.throttled = throttled  # the digest of a token over its rate


class LinkError(Exception):
    """The other side sent what this protocol doesn't allow."""


async def send(writer: asyncio.StreamWriter, message: Mapping[str, Any]) -> None:
    writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message; None at the end. LinkError for a line too long or not a JSON object."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as end:
        if end.partial:
            raise LinkError("the link ended inside a line") from end
        return None
    except asyncio.LimitOverrunError as err:
        raise LinkError(f"a line over {MAX_LINE} bytes") from err
    try:
        message = json.loads(line, object_pairs_hook=_bounded_object)
    except (ValueError, RecursionError) as err:
        raise LinkError(f"a line that is no JSON: {err}") from err
    if not isinstance(message, dict):
        raise LinkError("a line that is no JSON object")
    return message


def _bounded_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object of MAX_KEYS keys at most. A forked endpoint shares the controller's string-hash
    secret (endpoint/prefork.py): one that pods' bytes took over could send keys that all collide,
    and a dict of n of them costs n squared. 256 keys cost nothing; a report has 16 metrics at most."""
    if len(pairs) > MAX_KEYS:
        raise ValueError(f"an object of {len(pairs)} keys (at most {MAX_KEYS})")
    return dict(pairs)


class EndpointSide:
    """The endpoint's end: a Desk (endpoint/server.py) whose answers come from the controller."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count(1)

    async def submit(self, identity: Identity, job: JobKey, report: dict[str, Any]) -> str:
        if len(self.pending) >= MAX_PENDING:
            raise Refused(503, "unavailable", BUSY, 1.0)
        ask = next(self.ids)
        answer = self.pending[ask] = asyncio.get_running_loop().create_future()
        try:
            await send(self.writer, {"id": ask, "job": list(job), "report": report, "identity": {
                "namespace": identity.namespace, "pod": identity.pod, "podUID": identity.pod_uid}})
            said = await asyncio.wait_for(answer, ANSWER_TIMEOUT)
        except (TimeoutError, ConnectionError) as err:
            raise Refused(503, "unavailable", BUSY, 1.0) from err
        finally:
            self.pending.pop(ask, None)
        if said.get("status") == 202:
            return str(said.get("message") or "accepted")
        raise Refused(int(said.get("status") or 503), str(said.get("result") or "unavailable"),
                      str(said.get("message") or BUSY))

    async def run(self, on_cert: Callable[[Mapping[str, str]], None]) -> None:
        """Until the controller's end closes: answers to their questions, certificates to `on_cert`."""
        while (message := await receive(self.reader)) is not None:
            if isinstance(message.get("cert"), dict):
                on_cert(message["cert"])
            elif (waiting := self.pending.get(message.get("id"))) is not None and not waiting.done():  # type: ignore[arg-type]
                waiting.set_result(message)

    async def tell(self, message: Mapping[str, Any]) -> None:
        await send(self.writer, message)


class Desk(Protocol):
    """What the controller's end asks (control/progress_desk.py's ProgressDesk): the accepted message, or Refused."""

    def record(self, identity: Identity, job: JobKey, body: Any) -> str: ...


async def serve_controller_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, desk: Desk,
                                on_stats: Callable[[Mapping[str, Any]], None]) -> None:
    """The controller's end, until the endpoint's closes; LinkError for a line out of protocol."""
    while (message := await receive(reader)) is not None:
        if "id" not in message:
            on_stats(message)
            continue
        ask, identity, job = message.get("id"), message.get("identity"), message.get("job")
        if not (isinstance(ask, int) and isinstance(identity, dict) and isinstance(job, list) and len(job) == 2
                and all(isinstance(identity.get(k), str) for k in ("namespace", "pod", "podUID"))
                and all(isinstance(part, str) for part in job)):
            raise LinkError("a question without its id, identity or job")
        try:
            said = desk.record(Identity(identity["namespace"], identity["pod"], identity["podUID"], 0.0),
                               (job[0], job[1]), message.get("report"))
            answer = {"id": ask, "status": 202, "result": "accepted", "message": said}
        except Refused as refused:
            answer = {"id": ask, "status": refused.status, "result": refused.result, "message": refused.message}
        await send(writer, answer)
