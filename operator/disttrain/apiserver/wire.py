"""The API server's list and watch envelopes as msgspec reads them: a page of items with its
resourceVersion and continue token, and a watch line's type and object. Each watch decodes its
items into only what it keeps (watch/pod_events.py says why); these are the parts they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

Item = TypeVar("Item")
Held = TypeVar("Held")


class ListMetadata(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class Page(msgspec.Struct, Generic[Item]):
    items: list[Item] | None = None
    metadata: ListMetadata = msgspec.field(default_factory=ListMetadata)


class WatchEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw  # the object, or a Status for ERROR: decoded once the type is known


_events = msgspec.json.Decoder(WatchEvent)


def page_decoder(item: Any, hold: Callable[[Any], Held]) -> Callable[[bytes], tuple[list[Held], str, str]]:
    """A list page's decoder: its items as `item`, each made what is held by `hold`, the page's
    resourceVersion and continue token."""
    pages = msgspec.json.Decoder(Page[item])

    def decode(page: bytes) -> tuple[list[Held], str, str]:
        found = pages.decode(page)
        return [hold(i) for i in found.items or ()], found.metadata.resourceVersion, found.metadata.continue_
    return decode


def event_decoder(item: Any, hold: Callable[[Any], Held]) -> Callable[[bytes], tuple[str, Any]]:
    """A watch line's decoder: its type and object (`item` made what is held by `hold`; for ERROR,
    the Status whole)."""
    objects = msgspec.json.Decoder(item)

    def decode(line: bytes) -> tuple[str, Any]:
        event = _events.decode(line)
        if event.type == "ERROR":
            status: dict[str, Any] = msgspec.json.decode(event.object)
            return event.type, status
        return event.type, hold(objects.decode(event.object))
    return decode
