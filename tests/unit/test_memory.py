"""The burst's memory is given back once the operator is quiet (runtime/memory.py)."""

from __future__ import annotations

import asyncio

import pytest

from disttrain.runtime import memory


def test_trims_once_after_work_then_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []

    def trim() -> int:
        trims.append(1)
        return 1
    monkeypatch.setattr(memory, "_trimmer", lambda: trim)
    done = [0]

    async def scenario() -> None:
        task = asyncio.create_task(memory.trim_when_quiet(lambda: done[0], quiet=0.02))
        await asyncio.sleep(0.1)
        assert trims == [], "no work yet: nothing to give back"
        done[0] = 200  # a burst
        await asyncio.sleep(0.1)
        assert trims == [1], "quiet after work: one trim"
        await asyncio.sleep(0.1)
        assert trims == [1], "still quiet: not again"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_glibcs_malloc_trim_is_found_and_runs() -> None:
    trim = memory._trimmer()
    assert trim is not None and trim() in (0, 1)
