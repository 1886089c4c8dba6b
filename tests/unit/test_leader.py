"""Leader election on a Lease, with a hand-moved clock: take, keep, take over, lose."""

from __future__ import annotations

import asyncio
import datetime
import threading
from typing import Any

import pytest
from fakes import FakeClock, FakeLeases

from disttrain.runtime.leader import LeaseElector


def electors(clock: FakeClock, duration: int = 15) -> tuple[LeaseElector, LeaseElector]:
    return (LeaseElector("ops", "disttrain", "a", duration, clock),
            LeaseElector("ops", "disttrain", "b", duration, clock))


def test_the_first_replica_takes_the_lease_and_the_second_stands_by() -> None:
    async def scenario() -> None:
        clock, leases = FakeClock(), FakeLeases()
        a, b = electors(clock)
        assert await a.try_hold(leases)
        assert not await b.try_hold(leases)
        clock.advance(10)
        assert await a.try_hold(leases), "the holder renews"
        clock.advance(10)
        assert not await b.try_hold(leases), "renewed 10 s ago: still held"
        spec = leases.leases[("ops", "disttrain")]["spec"]
        assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0
    asyncio.run(scenario())


def test_a_lease_not_renewed_for_its_duration_is_taken_over() -> None:
    async def scenario() -> None:
        clock, leases = FakeClock(), FakeLeases()
        a, b = electors(clock)
        assert await a.try_hold(leases)
        assert not await b.try_hold(leases)  # b sees the record (client-go: a new candidate waits a duration)
        clock.advance(16)
        assert await b.try_hold(leases)
        spec = leases.leases[("ops", "disttrain")]["spec"]
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
        assert not await a.try_hold(leases), "the old holder finds it lost"
    asyncio.run(scenario())


def test_of_two_replicas_taking_an_expired_lease_at_once_one_wins() -> None:
    async def scenario() -> list[bool]:
        clock, leases = FakeClock(), FakeLeases()
        first = LeaseElector("ops", "disttrain", "gone", 15, clock)
        await first.try_hold(leases)
        a, b = electors(clock)
        await asyncio.gather(a.try_hold(leases), b.try_hold(leases))  # both see the holder's record
        clock.advance(20)
        return list(await asyncio.gather(a.try_hold(leases), b.try_hold(leases)))
    assert sorted(asyncio.run(scenario())) == [False, True]


def test_keep_returns_once_another_replica_holds_the_lease() -> None:
    async def scenario() -> None:
        clock, leases = FakeClock(), FakeLeases()
        a, b = electors(clock, duration=1)
        assert await a.try_hold(leases)
        assert not await b.try_hold(leases)
        clock.advance(2)
        assert await b.try_hold(leases)
        # False: lost, the caller exits the process (True would mean stepped down, and carrying on)
        assert await asyncio.wait_for(a.keep(leases), timeout=5) is False
    asyncio.run(scenario())


class UnreachableAtFirst(FakeLeases):
    """The API server restarting: the first reads are refused at the socket."""

    refusals: int = 2

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.refusals:
            self.refusals -= 1
            raise ConnectionRefusedError(111, "Connect call failed")
        return await super().read(namespace, name)


def test_a_standby_waits_out_an_unreachable_api_server(caplog: pytest.LogCaptureFixture) -> None:
    leases = UnreachableAtFirst()
    a, _ = electors(FakeClock())
    asyncio.run(a.acquire(leases, retry_seconds=0))
    assert leases.leases[("ops", "disttrain")]["spec"]["holderIdentity"] == "a"
    warnings = [r.getMessage() for r in caplog.records if "leader election" in r.getMessage()]
    assert len(warnings) == 2 and "ConnectionRefusedError" in warnings[0]
    assert not [r for r in caplog.records if r.exc_info], "one line each, no traceback"


class Hanging(FakeLeases):
    """etcd paused: after the first renewal, every read waits as long as the pause lasts."""

    hang = False

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.hang:
            await asyncio.sleep(3600)
        return await super().read(namespace, name)


def test_a_hanging_renewal_gives_up_two_thirds_of_a_duration_after_the_last_renew_time() -> None:
    """A standby takes over one duration after it saw the holder's last renewal: the holder must
    have stopped before then, however long its own request hangs (real time: a 3 s Lease)."""
    async def scenario() -> float:
        leases = Hanging()
        holder = LeaseElector("ops", "disttrain", "a", 3)
        assert await holder.try_hold(leases)
        assert holder.renewed_at is not None
        leases.hang = True
        assert await asyncio.wait_for(holder.keep(leases), timeout=10) is False
        return holder.clock.monotonic() - holder.renewed_at
    held_for = asyncio.run(scenario())
    assert 2.0 <= held_for < 2.5, held_for


def test_a_standby_whose_clock_runs_ahead_does_not_take_a_renewed_lease() -> None:
    """Issue 21, defect 11: the standby compared the Lease's renewTime (the leader's wall clock)
    with its own wall clock, so a standby 20 s ahead took the Lease from a healthy leader. It now
    times from when it saw the record change, on its own monotonic clock, as client-go does."""
    async def scenario() -> None:
        leases = FakeLeases()
        leader_clock, standby_clock = FakeClock(), FakeClock()
        standby_clock.wall += datetime.timedelta(seconds=20)  # NTP gone wrong on the standby's node
        a = LeaseElector("ops", "disttrain", "a", 15, leader_clock)
        b = LeaseElector("ops", "disttrain", "b", 15, standby_clock)
        assert await a.try_hold(leases)
        for _ in range(6):  # the leader renews every 5 s; the standby keeps trying
            assert not await b.try_hold(leases), "a renewed Lease is not taken"
            for clock in (leader_clock, standby_clock):
                clock.advance(5)
            assert await a.try_hold(leases)
        assert not await b.try_hold(leases)  # the leader's last renewal, seen; then it stops
        for clock in (leader_clock, standby_clock):
            clock.advance(16)
        assert await b.try_hold(leases), "one duration after the record last changed, by the standby's clock"
    asyncio.run(scenario())


def test_a_leader_that_stops_releases_the_lease_and_its_standby_takes_it_at_the_next_try() -> None:
    """A deleted leader pod's Lease stayed held until its duration ran out: 15 s with no operator,
    and in CI a Deployment's replacement pod, started meanwhile, raced the standby for it (the
    e2e failover test, stop 48). Stopped, the leader now releases it as client-go's
    ReleaseOnCancel does: an empty holder with a duration of 1 s."""
    async def scenario() -> None:
        clock, leases = FakeClock(), FakeLeases()
        a, b = electors(clock)
        assert await a.try_hold(leases)
        assert not await b.try_hold(leases)
        stop = threading.Event()
        stop.set()  # kopf has stopped (SIGTERM)
        assert await asyncio.wait_for(a.keep(leases, stop), timeout=5), "stepped down, not lost"
        spec = leases.leases[("ops", "disttrain")]["spec"]
        assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
        assert await b.try_hold(leases), "taken at once: no clock advanced"
        assert leases.leases[("ops", "disttrain")]["spec"]["leaseTransitions"] == 1
    asyncio.run(scenario())


def test_a_replica_releases_only_a_lease_it_holds() -> None:
    async def scenario() -> None:
        clock, leases = FakeClock(), FakeLeases()
        a, b = electors(clock)
        assert not await b.release(leases), "no Lease yet"
        assert await a.try_hold(leases)
        before = leases.leases[("ops", "disttrain")]
        assert not await b.release(leases)
        assert leases.leases[("ops", "disttrain")] == before
    asyncio.run(scenario())


class Conflicting(FakeLeases):
    """Another writer between our read and our write: every replace answers 409."""

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        return False


def test_a_release_that_conflicts_leaves_the_lease_to_expire() -> None:
    async def scenario() -> None:
        leases = Conflicting()
        a, _ = electors(FakeClock())
        assert await a.try_hold(leases)  # created, not replaced
        stop = threading.Event()
        stop.set()
        assert await asyncio.wait_for(a.keep(leases, stop), timeout=5), "stepped down all the same"
        assert leases.leases[("ops", "disttrain")]["spec"]["holderIdentity"] == "a"
    asyncio.run(scenario())


def test_a_release_that_hangs_gives_up_within_two_thirds_of_a_duration() -> None:
    async def scenario() -> float:
        leases = Hanging()
        holder = LeaseElector("ops", "disttrain", "a", 3)
        assert await holder.try_hold(leases)
        leases.hang = True
        stop = threading.Event()
        stop.set()
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(holder.keep(leases, stop), timeout=10)
        return asyncio.get_running_loop().time() - started
    assert asyncio.run(scenario()) < 2.5


def test_a_renewal_in_flight_when_stop_is_set_comes_before_the_release() -> None:
    """The renewal and the release are one thread's, in turn: a renewal that read the Lease before
    the stop can't write it back over the release."""
    class Slow(FakeLeases):
        stop: threading.Event | None = None
        reads = 0

        async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
            self.reads += 1
            found = await super().read(namespace, name)
            if self.reads == 2 and self.stop is not None:  # the first renewal: stop while it is in flight
                self.stop.set()
                await asyncio.sleep(0.2)
            return found

    async def scenario() -> None:
        leases, stop = Slow(), threading.Event()
        leases.stop = stop
        a, b = electors(FakeClock(), duration=1)
        assert await a.try_hold(leases)
        assert await asyncio.wait_for(a.keep(leases, stop), timeout=5)
        assert leases.reads == 3, "the renewal, then the release's read"
        assert leases.leases[("ops", "disttrain")]["spec"]["holderIdentity"] == ""
        assert await b.try_hold(leases)
    asyncio.run(scenario())
