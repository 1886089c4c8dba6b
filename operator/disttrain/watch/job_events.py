"""DistTrainJob events decoded into the job as the controller holds it (HeldJob).

The spec and status are kept as the API server's own JSON bytes (msgspec.Raw: a slice of the
event, neither decoded nor encoded again), decoded when a pass reads them: a decoded job is ~10 KB
of Python objects where its JSON is ~1 KB (`make bench`: memory per pod held, issue 25). kopf,
which followed jobs until issue 45, decoded each event whole into dicts and its Body, and the
index then encoded spec and status again. Only the metadata is decoded, without managedFields and
kubectl's copy of the manifest (held_metadata).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from disttrain.apiserver.wire import event_decoder, page_decoder

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
EMPTY = b"{}"


class HeldJob(Mapping[str, Any]):
    """A job as the controller holds it: metadata decoded, spec and status as JSON, decoded when read
    (a pass reads each once: tens of microseconds)."""

    __slots__ = ("_spec", "_status", "metadata")

    def __init__(self, metadata: Mapping[str, Any], spec: bytes = EMPTY, status: bytes = EMPTY) -> None:
        self.metadata = held_metadata(metadata)
        self._spec, self._status = spec, status

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> HeldJob:
        """From a decoded job (a test's, a fake API's)."""
        return cls(body.get("metadata") or {}, msgspec.json.encode(body.get("spec") or {}),
                   msgspec.json.encode(body.get("status") or {}))

    def __getitem__(self, key: str) -> Any:
        if key == "metadata":
            return self.metadata
        if key in ("spec", "status"):
            return msgspec.json.decode(self._spec if key == "spec" else self._status)
        raise KeyError(key)

    def __eq__(self, other: object) -> bool:
        """Compared as held, undecoded (Mapping's own == decodes both)."""
        if not isinstance(other, HeldJob):
            return NotImplemented
        return (self.metadata, self._spec, self._status) == (other.metadata, other._spec, other._status)

    __hash__ = None  # type: ignore[assignment]  # mutable metadata, as a dict's

    def __iter__(self) -> Iterator[str]:
        return iter(("metadata", "spec", "status"))

    def __len__(self) -> int:
        return 3


def held_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A job's metadata as held: without managedFields and kubectl's copy of the manifest, which
    reconciling never reads; they were 45% of a held job's memory (7.8 of 17.5 KB for `make
    bench`'s job, measured with sys.getsizeof over the decoded body)."""
    held = {k: v for k, v in meta.items() if k != "managedFields"}
    if LAST_APPLIED in (held.get("annotations") or {}):
        held["annotations"] = {k: v for k, v in held["annotations"].items() if k != LAST_APPLIED}
    return held


class _Job(msgspec.Struct):
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    spec: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(EMPTY))
    status: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(EMPTY))


def _held(job: _Job) -> HeldJob:
    # bytes(): a Raw is a view of the whole event's buffer, which would stay alive with it.
    return HeldJob(job.metadata, bytes(job.spec), bytes(job.status))


# A watch line: its type and object (the job held; a Status, whole, for ERROR; a bookmark's metadata
# only). A list page: its jobs (held), resourceVersion and continue token.
decode_event = event_decoder(_Job, _held)
decode_list = page_decoder(_Job, _held)
