"""A work queue of job keys, in the manner of client-go's: a key queued many times while it
waits is reconciled once; one key is never reconciled by two workers at once; a key queued
while it is being reconciled runs again afterwards; failures retry with growing delays."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from disttrain.apiserver.retries import Explained, explain

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)


class WorkQueue(Generic[K]):
    def __init__(
        self, handle: Callable[[K], Awaitable[float | None]], workers: int = 8,
        base_delay: float = 0.2, max_delay: float = 60.0,
        explain: Callable[[BaseException], Explained | None] = explain,
        on_failure: Callable[[K, Explained], Awaitable[None]] | None = None,
    ) -> None:
        self._handle = handle
        self._explain, self._on_failure = explain, on_failure
        self._workers = workers
        self._base_delay, self._max_delay = base_delay, max_delay
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()  # queued, not yet picked up
        self._active: set[K] = set()  # being handled now
        self._again: set[K] = set()  # queued again while being handled
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._soon: dict[K, asyncio.TimerHandle] = {}  # add_soon's, apart from the retries' and requeues' timers
        self._tasks: list[asyncio.Task[None]] = []
        self.handled = 0  # passes run so far (runtime/memory.py trims after a burst of them)

    def add(self, key: K) -> None:
        if (soon := self._soon.pop(key, None)) is not None:
            soon.cancel()  # the pass queued now, or again after this one, reads what the timer was for
        if key in self._active:
            self._again.add(key)
        elif key not in self._waiting:
            self._waiting.add(key)
            self._queue.put_nowait(key)

    def backlog(self) -> int:
        """Keys queued that no worker has picked up yet, and those add_soon queues within a moment."""
        return len(self._waiting) + len(self._soon)

    def add_after(self, key: K, delay: float) -> None:
        """Queue `key` in `delay` seconds; an earlier timer for the key wins."""
        loop = asyncio.get_running_loop()
        current = self._timers.get(key)
        when = loop.time() + delay
        if current is not None and current.when() <= when:
            return
        if current is not None:
            current.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def add_soon(self, key: K, within: float) -> None:
        """Queue `key` in `within` seconds, so that what changes meanwhile shares one pass; nothing
        where it is queued already (that pass will see it). A key being reconciled runs again then."""
        if key in self._waiting or key in self._again or key in self._soon:
            return
        self._soon[key] = asyncio.get_running_loop().call_later(within, self._soon_due, key)

    def _soon_due(self, key: K) -> None:
        del self._soon[key]
        self.add(key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)
        for timers in (self._timers, self._soon):
            if (timer := timers.pop(key, None)) is not None:
                timer.cancel()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"reconcile-{i}") for i in range(self._workers)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for timer in (*self._timers.values(), *self._soon.values()):
            timer.cancel()
        self._timers.clear()
        self._soon.clear()

    async def join(self) -> None:
        """Wait until nothing is queued, about to be (add_soon) or running (for tests and benchmarks)."""
        while self._waiting or self._active or self._again or self._soon:
            await asyncio.sleep(0.01)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._waiting.discard(key)
            self._active.add(key)
            self.handled += 1
            try:
                requeue = await self._handle(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = min(self._max_delay, self._base_delay * 2 ** (failures - 1))
                explained = self._explain(err)
                if explained is not None:
                    # The API server's doing (restarting, throttling, refusing): one line, not a
                    # traceback (the chaos tests read the log for tracebacks of real bugs).
                    delay = max(delay, explained.wait_at_least)
                    log.warning("reconciling %s failed (attempt %d): %s; retrying in %.1fs", key, failures,
                                explained.what, delay)
                    if self._on_failure is not None:
                        await self._on_failure(key, explained)
                else:
                    log.exception("reconciling %s failed (attempt %d); retrying in %.1fs", key, failures, delay)
                self.add_after(key, delay)
            else:
                self._failures.pop(key, None)
                if requeue is not None:
                    self.add_after(key, requeue)
            finally:
                self._active.discard(key)
                if key in self._again:
                    self._again.discard(key)
                    self.add(key)
