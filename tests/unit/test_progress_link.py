"""The link between the controller and the progress endpoint (runtime/progress_link.py): what a line
may hold. A forked endpoint shares the controller's string-hash secret (endpoint/prefork.py), so
an object's keys are bounded: n keys that collide cost n squared to make into a dict."""

from __future__ import annotations

import asyncio
import json

import pytest

from disttrain.runtime.progress_link import MAX_KEYS, LinkError, receive


def read(line: bytes) -> object:
    async def main() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(line)
        reader.feed_eof()
        return await receive(reader)
    return asyncio.run(main())


def test_an_object_of_max_keys_is_read() -> None:
    message = {"counts": {f"k{i}": i for i in range(MAX_KEYS)}}
    assert read(json.dumps(message).encode() + b"\n") == message


def test_an_object_of_more_keys_ends_the_link_with_a_reason() -> None:
    with pytest.raises(LinkError, match=f"at most {MAX_KEYS}"):
        read(json.dumps({"counts": {f"k{i}": i for i in range(MAX_KEYS + 1)}}).encode() + b"\n")
