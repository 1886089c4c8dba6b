"""The work queue: a key queued many times is handled once, never by two workers at once, again
if queued while handled, and retried with growing delays when its handler fails."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from disttrain.control.workqueue import WorkQueue


def test_a_key_queued_many_times_while_waiting_is_handled_once() -> None:
    async def scenario() -> list[str]:
        handled: list[str] = []

        async def handle(key: str) -> None:
            handled.append(key)
        queue: WorkQueue[str] = WorkQueue(handle, workers=4)
        for _ in range(5):
            queue.add("a")
        queue.add("b")
        queue.start()
        await queue.join()
        await queue.stop()
        return handled
    assert sorted(asyncio.run(scenario())) == ["a", "b"]


def test_one_key_is_never_handled_twice_at_once_and_runs_again_if_queued_meanwhile() -> None:
    async def scenario() -> tuple[int, int]:
        running, most, calls = 0, 0, 0
        queue: WorkQueue[str]

        async def handle(key: str) -> None:
            nonlocal running, most, calls
            running, calls = running + 1, calls + 1
            most = max(most, running)
            if calls == 1:
                queue.add(key)  # an event arrives while the key is being reconciled
                queue.add(key)
            await asyncio.sleep(0.01)
            running -= 1
        queue = WorkQueue(handle, workers=4)
        queue.add("a")
        queue.start()
        await asyncio.sleep(0.05)
        await queue.join()
        await queue.stop()
        return most, calls
    most, calls = asyncio.run(scenario())
    assert most == 1
    assert calls == 2, "queued twice while handled: handled once more, not twice"


def times_handled(failures: list[Exception], base_delay: float) -> list[float]:
    """When a key was handled by a queue whose handler raises each of `failures` in turn, then succeeds."""
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        times: list[float] = []

        async def handle(key: str) -> None:
            times.append(loop.time())
            if len(times) <= len(failures):
                raise failures[len(times) - 1]
        queue: WorkQueue[str] = WorkQueue(handle, workers=1, base_delay=base_delay)
        queue.add("a")
        queue.start()
        while len(times) <= len(failures):
            await asyncio.sleep(0.01)
        await queue.stop()
        return times
    return asyncio.run(scenario())


def test_failures_retry_with_growing_delays_and_success_resets_them() -> None:
    times = times_handled([RuntimeError("API server unavailable")] * 3, base_delay=0.02)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04 and gaps[2] >= 0.08, gaps


def test_a_requeue_after_comes_back_and_the_earlier_timer_wins() -> None:
    async def scenario() -> list[str]:
        handled: list[str] = []

        async def handle(key: str) -> float | None:
            handled.append(key)
            return 0.05 if len(handled) == 1 else None
        queue: WorkQueue[str] = WorkQueue(handle, workers=1)
        queue.add("a")
        queue.start()
        await asyncio.sleep(0.02)
        queue.add_after("a", 5.0)  # later than the pending 0.05 s: ignored
        await asyncio.sleep(0.1)
        await queue.stop()
        return handled
    assert asyncio.run(scenario()) == ["a", "a"]


def test_add_soon_gives_a_queued_key_no_timer_and_a_key_being_handled_another_pass() -> None:
    """A key already queued gets no timer (its pass sees the change); one being handled runs again
    once the delay is out, after its pass; join waits for a pending add_soon."""
    async def scenario() -> tuple[list[str], bool]:
        handled: list[str] = []
        gate = asyncio.Event()

        async def handle(key: str) -> None:
            handled.append(key)
            if key == "slow" and handled.count("slow") == 1:
                await gate.wait()
        queue: WorkQueue[str] = WorkQueue(handle, workers=2)
        queue.add("b")
        queue.add_soon("b", 0.2)  # queued already: its pass is the one
        queued_had_no_timer = "b" not in queue._soon
        queue.start()
        await queue.join()
        queue.add("slow")
        await asyncio.sleep(0.05)
        queue.add_soon("slow", 0.1)  # while it is handled
        await asyncio.sleep(0.2)
        gate.set()
        await queue.join()
        await queue.stop()
        return handled, queued_had_no_timer
    handled, queued_had_no_timer = asyncio.run(scenario())
    assert queued_had_no_timer
    assert handled == ["b", "slow", "slow"], handled


def test_five_add_soons_are_one_pass_after_the_delay_and_an_add_or_forget_ends_the_wait() -> None:
    """A job's pods' events (watch/podwatch.py POD_EVENTS_WITHIN) within the delay: one pass, after it;
    none more for a key queued at once meanwhile, nor for one forgotten."""
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        began, handled = loop.time(), []

        async def handle(key: str) -> None:
            handled.append(loop.time() - began)
        queue: WorkQueue[str] = WorkQueue(handle, workers=2)
        queue.start()
        for _ in range(5):
            queue.add_soon("a", 0.2)
        await queue.join()
        queue.add_soon("b", 0.2)
        queue.add("b")  # at once: the timer's pass would find nothing new
        await queue.join()
        queue.add_soon("c", 0.2)
        queue.forget("c")  # the job gone
        await queue.join()
        await queue.stop()
        return handled
    handled = asyncio.run(scenario())
    assert len(handled) == 2 and handled[0] >= 0.19, handled


def test_a_throttled_pass_waits_its_retry_after_and_logs_the_api_servers_words_not_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """A 429 on a delete (issue 21, chaos through the fault proxy): the retry waits at least the
    Retry-After the API server asked for, and the log line names it, with no traceback."""
    from disttrain.apiserver.rest import ApiError

    err = ApiError(429, "Too Many Requests", b'{"kind":"Status","code":429,"reason":"TooManyRequests",'
                                             b'"message":"slow down"}', {"Retry-After": "0.3"})
    times = times_handled([err], base_delay=0.01)
    assert times[1] - times[0] >= 0.3
    [record] = [r for r in caplog.records if "failed" in r.getMessage()]
    assert "throttled (429): slow down" in record.getMessage() and record.exc_info is None


def test_a_bug_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    times_handled([KeyError("metadata")], base_delay=0.01)
    [record] = [r for r in caplog.records if "failed" in r.getMessage()]
    assert record.exc_info is not None


def test_add_soon_while_a_key_is_handled_runs_again_after_the_delay_and_stop_drops_its_timers() -> None:
    """The guarantees the test above can't tell apart (the review of f51734a): a key being handled
    runs again when the timer fires, not as soon as its pass ends; an add_soon for a key already set
    to run again sets no timer; an add at once while a timer waits and the key is handled cancels the
    timer (one more pass, not two); stop leaves no timer behind; a pending add_soon counts in the
    backlog."""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        times: list[float] = []
        gate = asyncio.Event()

        async def handle(key: str) -> None:
            times.append(loop.time())
            if len(times) == 1:
                await gate.wait()
        queue: WorkQueue[str] = WorkQueue(handle, workers=2)
        queue.start()
        queue.add("k")
        await asyncio.sleep(0.02)
        queue.add_soon("k", 0.3)  # while handled
        assert "k" in queue._soon and queue.backlog() == 1
        gate.set()
        await asyncio.sleep(0.05)  # its pass ended: the second waits for the timer
        assert len(times) == 1, times
        await queue.join()
        assert len(times) == 2 and times[1] - times[0] >= 0.29, times

        gate.clear()
        times.clear()
        queue.add("k")
        await asyncio.sleep(0.02)
        queue.add("k")  # to run again after this pass
        queue.add_soon("k", 0.3)  # that pass will see it: no timer
        assert "k" not in queue._soon
        gate.set()
        await queue.join()
        assert len(times) == 2, times

        gate.clear()
        times.clear()
        queue.add("k")
        await asyncio.sleep(0.02)
        queue.add_soon("k", 0.3)
        queue.add("k")  # at once, while the timer waits: the timer goes
        assert "k" not in queue._soon
        gate.set()
        await queue.join()
        await asyncio.sleep(0.35)
        assert len(times) == 2, times

        queue.add_soon("late", 10)
        await queue.stop()
        assert not queue._soon and not queue._timers
    asyncio.run(scenario())
