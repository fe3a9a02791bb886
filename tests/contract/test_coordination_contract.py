"""One contract for placement's leases, wake claims and worker failures, on memory and on a
real Redis."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis

from ground.registry import keys
from placement.adapters.coordination import RedisCoordination
from placement.adapters.memory import MemoryClaimBook, MemoryFailureBook, MemoryLeaseStore
from placement.core.claims import Claims
from placement.core.failures import WorkerFailures
from placement.fleet.failuresync import FailureSync
from placement.leases import LeaseKeeper
from placement.ports.failures import MAX_REPORTS
from placement.ports.leases import Taken
from placement.wakes import wakeclaims
from placement.wakes.wakeclaims import WakeClaims
from tests.support.lease_watch import released_heard


class Backend:
    def __init__(self, leases: Any, book: Any, failures: Any) -> None:
        self.leases, self.book, self.failures = leases, book, failures


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield Backend(MemoryLeaseStore(), MemoryClaimBook(), MemoryFailureBook())
        return
    url = await request.getfixturevalue("redis_server").flushed()
    both = RedisCoordination(url)
    yield Backend(both, both, both)
    await both.close()


async def test_a_lease_is_held_by_one_holder_until_it_lapses(backend: Backend) -> None:
    first = await backend.leases.acquire("reconcile:a", "p1", 0.3)
    assert isinstance(first, int)
    other = await backend.leases.acquire("reconcile:a", "p2", 0.3)
    assert isinstance(other, Taken) and 0 < other.remaining_s <= 0.3
    assert await backend.leases.acquire("reconcile:a", "p1", 0.3) == first  # a renewal
    await asyncio.sleep(0.4)
    second = await backend.leases.acquire("reconcile:a", "p2", 0.3)
    assert isinstance(second, int) and second > first  # a new holder: a greater token


async def test_renew_keeps_only_leases_still_held_with_their_token(backend: Backend) -> None:
    a = await backend.leases.acquire("x", "p1", 0.3)
    b = await backend.leases.acquire("y", "p1", 0.3)
    assert isinstance(a, int) and isinstance(b, int)
    assert await backend.leases.renew([("x", a), ("y", b + 1)], "p1", 0.3) == [True, False]
    await asyncio.sleep(0.2)
    assert await backend.leases.renew([("x", a)], "p1", 0.3) == [True]
    await asyncio.sleep(0.2)  # x was renewed: still held; y was not
    assert isinstance(await backend.leases.acquire("x", "p2", 0.3), Taken)
    assert isinstance(await backend.leases.acquire("y", "p2", 0.3), int)


async def test_release_frees_a_lease_only_for_its_holder(backend: Backend) -> None:
    token = await backend.leases.acquire("z", "p1", 5)
    assert isinstance(token, int)
    await backend.leases.release("z", "p2", token)
    assert isinstance(await backend.leases.acquire("z", "p2", 5), Taken)
    await backend.leases.release("z", "p1", token)
    assert isinstance(await backend.leases.acquire("z", "p2", 5), int)


async def test_a_watcher_hears_its_lease_released_and_only_by_its_holder(
    backend: Backend,
) -> None:
    leases = backend.leases
    await released_heard(leases, "wake:a", "p1")  # releases are heard
    token = await leases.acquire("wake:a", "p1", 5)
    assert isinstance(token, int)
    watching, other = leases.watch("wake:a"), leases.watch("wake:b")
    try:
        await leases.release("wake:a", "p2", token)  # not its holder: nothing released
        b = await leases.acquire("wake:b", "p3", 5)
        assert isinstance(b, int)
        await leases.release("wake:b", "p3", b)
        await asyncio.wait_for(other.wait(), 5)  # heard in order: a's would be heard first
        assert not watching.is_set()
        await leases.release("wake:a", "p1", token)
        await asyncio.wait_for(watching.wait(), 5)
    finally:
        leases.unwatch("wake:a", watching)
        leases.unwatch("wake:b", other)


async def test_tokens_grow_across_names_and_holders(backend: Backend) -> None:
    tokens = []
    for i in range(5):
        token = await backend.leases.acquire(f"n{i}", f"p{i}", 5)
        assert isinstance(token, int)
        tokens.append(token)
    assert tokens == sorted(set(tokens))


async def test_claims_are_summed_over_other_placements_and_expire(backend: Backend) -> None:
    book = backend.book
    await book.publish("app", "p1", Claims(2, frozenset({"m1"})), 0.3)
    await book.publish("app", "p2", Claims(1, frozenset({"m2"})), 5)
    assert await book.others("app", "p3") == Claims(3, frozenset({"m1", "m2"}))
    assert await book.others("app", "p1") == Claims(1, frozenset({"m2"}))
    await asyncio.sleep(0.4)
    assert await book.others("app", "p3") == Claims(1, frozenset({"m2"}))
    await book.publish("app", "p2", Claims(), 5)  # withdrawn
    assert await book.others("app", "p3") == Claims()
    assert await book.others("other-app", "p3") == Claims()


async def test_demand_is_kept_per_edge_summed_and_expires(backend: Backend) -> None:
    book = backend.book
    assert await book.report("app", "e1", 100, 0.3) == 100
    assert await book.report("app", "e2", 60, 5) == 160
    assert await book.report("app", "e1", 40, 0.3) == 100  # e1's replaced, not added
    assert await book.report("other", "e1", 7, 5) == 7  # per app
    await asyncio.sleep(0.4)
    assert await book.report("app", "e3", 1, 5) == 61  # e1's lapsed
    assert await book.report("app", "e2", 0, 5) == 1  # withdrawn
    assert await book.report("app", "e3", 0, 5) == 0


async def test_a_wakes_demand_lapses_only_if_no_newer_value_replaced_it(
    backend: Backend,
) -> None:
    book = backend.book
    await book.report("app", "e1", 1, 30)  # e1's wake says 1
    await book.report("app", "e2", 1, 30)  # e2's wake says 1...
    await book.report("app", "e2", 100, 30)  # ...and its load share 100 since
    await book.lapse("app", "e1", 1, 0.3)  # still 1: lapses soon
    await book.lapse("app", "e2", 1, 0.3)  # 100 now: left as it is
    await book.lapse("app", "e3", 5, 0.3)  # none: none
    assert await book.report("other", "e9", 0, 5) == 0
    await asyncio.sleep(0.4)
    assert await book.report("app", "e4", 0, 5) == 100  # e2's 100 only
    await book.report("app", "e5", 7, 0.2)  # an edge's, and the edge gone: it expires
    await asyncio.sleep(0.3)
    await book.lapse("app", "e5", 7, 5)  # its wake's end finds none: none
    assert await book.report("app", "e4", 0, 5) == 100


async def test_a_wakes_lapse_sent_beside_its_answer_lands_before_that_edges_next_report(
    backend: Backend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lapse of a wake's demand is sent after its answer; the same edge's next wake
    of the app (a retry, the same demand) reports at once. The lapse checks only the
    value, so landing second it would cut the new wake's entry to the lapse's term."""
    monkeypatch.setattr(wakeclaims, "DEMAND_AFTER_S", 0.2)
    claims = WakeClaims(backend.book, backend.leases, "pa")
    assert await claims.report("app", "e1", 1, 30) == 1  # the first wake's
    claims.report_after("app", "e1", 1)  # its answer sent; its lapse on its way
    assert await claims.report("app", "e1", 1, 30) == 1  # the retry's, for 30 s
    await asyncio.sleep(0.4)  # past the lapse's term
    assert await backend.book.report("app", "e2", 0, 5) == 1  # e1's retry still counts
    await claims.close()


async def test_a_herd_of_concurrent_calls_waits_for_connections_rather_than_failing(
    backend: Backend,
) -> None:
    """300 wakes at once: more calls in flight than the client has connections."""
    totals = await asyncio.gather(*(backend.book.report(f"app{i}", "e1", 1, 5)
                                    for i in range(300)))
    assert totals == [1] * 300


async def test_two_placements_plan_one_after_the_other(backend: Backend) -> None:
    """Two wakes of one app planned at once on two placements: the second sees the first's
    claims, so together they place what both asked for."""
    a = WakeClaims(backend.book, backend.leases, "pa")
    b = WakeClaims(backend.book, backend.leases, "pb")
    seen: list[Claims] = []

    async def wake(claims: WakeClaims, placing: int) -> None:
        loop = asyncio.get_running_loop()
        async with claims.planning("app", loop.time() + 2) as others:
            seen.append(others)
            await asyncio.sleep(0.05)  # the plan's own awaits: the other must wait
            claims.planned("app", [], placing)

    await asyncio.gather(wake(a, 4), wake(b, 4))
    assert sorted(s.placing for s in seen) == [0, 4]
    assert (await a.everyone("app")).placing == 8
    await a.close()
    await b.close()
    assert (await WakeClaims(backend.book, backend.leases, "pc").everyone("app")) == Claims()


async def test_a_change_outside_planning_is_published_at_once_not_at_the_refresh(
    backend: Backend,
) -> None:
    """A machine placed moves from placing to claimed: other placements must see that
    before the machine's own record reaches them, not a refresh period (1 s) later."""
    a = WakeClaims(backend.book, backend.leases, "pa")
    b = WakeClaims(backend.book, backend.leases, "pb")
    loop = asyncio.get_running_loop()
    async with a.planning("app", loop.time() + 2):
        a.planned("app", [], 2)
    for machine in ("m1", "m2"):
        await asyncio.sleep(0.05)
        a.placed("app", machine)
        await asyncio.sleep(0.05)
        assert machine in (await b.everyone("app")).starting
    assert await b.everyone("app") == Claims(0, frozenset({"m1", "m2"}))
    await a.close()
    await b.close()


class CountedBook:
    """A backend's claim book whose publishes are counted per app."""

    def __init__(self, book: Any) -> None:
        self.book, self.sent = book, Counter[str]()

    async def publish(self, app: str, me: str, claims: Claims, ttl_s: float) -> None:
        self.sent[app] += 1
        await self.book.publish(app, me, claims, ttl_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.book, name)


async def test_claims_that_stand_are_refreshed_on_their_own_time_not_at_each_change(
    backend: Backend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An app's standing claims outlive their TTL (refreshed every third of it), and other
    apps' changes meanwhile do not send them again (a herd's wakes each republished every
    claimed app)."""
    monkeypatch.setattr(wakeclaims, "CLAIM_TTL_S", 1.5)  # refreshed every 0.5 s
    book = CountedBook(backend.book)
    a = WakeClaims(book, backend.leases, "pa")  # type: ignore[arg-type]
    b = WakeClaims(backend.book, backend.leases, "pb")
    loop = asyncio.get_running_loop()
    async with a.planning("held", loop.time() + 2):
        a.planned("held", [], 1)
    for n in range(10):  # other apps' wakes, each planned and placed within 0.1 s
        async with a.planning(f"app{n}", loop.time() + 2):
            a.planned(f"app{n}", [], 1)
        a.placed(f"app{n}", f"m{n}")
        a.unclaim(f"app{n}", f"m{n}")
    await asyncio.sleep(0)
    assert book.sent["held"] <= 2  # its plan (and a refresh, on a slow machine)
    await asyncio.sleep(3.0)  # two TTLs: seen only if refreshed
    assert (await b.everyone("held")).placing == 1
    assert book.sent["held"] <= 12  # ~6 refreshes in 3 s, never one per change
    await a.close()
    await b.close()


class SlowOnce(CountedBook):
    """A claim book whose publish takes 0.1 s once `slow` is set (a new connection, a
    retry), then the rest at once."""

    slow = False

    async def publish(self, app: str, me: str, claims: Claims, ttl_s: float) -> None:
        if self.slow:
            self.slow = False
            await asyncio.sleep(0.1)
        await super().publish(app, me, claims, ttl_s)


async def test_an_older_send_of_an_apps_claims_never_lands_after_a_newer_one(
    backend: Backend,
) -> None:
    """A machine placed is being sent slowly when the next wake's plan is sent under the
    lease: the plan must be what another placement reads after, not the older send."""
    book = SlowOnce(backend.book)
    a = WakeClaims(book, backend.leases, "pa")  # type: ignore[arg-type]
    b = WakeClaims(backend.book, backend.leases, "pb")
    loop = asyncio.get_running_loop()
    async with a.planning("app", loop.time() + 2):
        a.planned("app", [], 1)
    book.slow = True
    a.placed("app", "m1")  # sent by the publisher: slowly
    await asyncio.sleep(0.01)
    async with a.planning("app", loop.time() + 2):
        a.planned("app", [], 3)
    await asyncio.sleep(0.2)
    assert await b.everyone("app") == Claims(3, frozenset({"m1"}))
    await a.close()
    await b.close()


async def test_a_keeper_renews_and_hands_back_its_leases(backend: Backend) -> None:
    keeper = LeaseKeeper(backend.leases, 0.9, holder="k1")
    lease = await keeper.acquire("reconcile:a")
    assert not isinstance(lease, Taken)
    await asyncio.sleep(1.2)  # longer than the TTL: renewed meanwhile
    assert keeper.valid(lease)
    assert isinstance(await backend.leases.acquire("reconcile:a", "k2", 1), Taken)
    await keeper.close()
    assert not keeper.valid(lease)
    assert isinstance(await backend.leases.acquire("reconcile:a", "k2", 1), int)


async def test_reports_are_kept_per_worker_within_the_window_and_bounded(
    backend: Backend,
) -> None:
    book = backend.failures
    assert await book.suspect("w1", 1, "edge-a", "m1", 0.3) == [("edge-a", "m1")]
    assert sorted(await book.suspect("w1", 1, "edge-b", "m2", 0.3)) == [
        ("edge-a", "m1"), ("edge-b", "m2")]
    assert await book.suspect("w2", 1, "edge-a", "m1", 0.3) == [("edge-a", "m1")]  # per worker
    await asyncio.sleep(0.4)
    assert await book.suspect("w1", 1, "edge-c", "m3", 0.3) == [("edge-c", "m3")]  # lapsed
    for i in range(MAX_REPORTS + 10):
        heard = await book.suspect("w3", 1, f"edge-{i}", "m1", 5)
    assert len(heard) == MAX_REPORTS
    assert ("odd\tname \"x\"", "m1") in await book.suspect("w4", 1, "odd\tname \"x\"", "m1", 5)


async def test_a_mark_stands_for_its_time_and_a_newer_epoch_replaces_it(
    backend: Backend,
) -> None:
    book = backend.failures
    assert await book.failed_workers() == []
    await book.mark_failed("w1", 3, "its agent does not answer: refused", 0.5)
    await book.mark_failed("w1", 3, "again", 5)  # standing, same epoch: kept as it was
    [mark] = await book.failed_workers()
    assert (mark.worker, mark.epoch, mark.reason) == ("w1", 3, "its agent does not answer: refused")
    assert 0 < mark.remaining_s <= 0.5
    await book.mark_failed("w1", 4, "down again", 0.5)
    [mark] = await book.failed_workers()
    assert (mark.epoch, mark.reason) == (4, "down again")
    await book.mark_failed("w2", 1, "two edges", 5)
    await asyncio.sleep(0.6)
    assert [m.worker for m in await book.failed_workers()] == ["w2"]


async def test_two_placements_judge_one_worker_from_both_ones_reports_and_marks(
    backend: Backend,
) -> None:
    a = FailureSync(WorkerFailures(time.monotonic), backend.failures)
    b = FailureSync(WorkerFailures(time.monotonic), backend.failures)
    assert await a.report("w1", 7, "edge-a", "m1") is False
    assert await b.report("w1", 7, "edge-b", "m2") is True  # two edges, two machines, anywhere
    assert await b.fail("w1", 7, "two edges could not connect to two of its machines")
    assert a.failures.failed("w1", 7) is None  # not read yet
    assert await a.adopt() == ["w1"]
    mark = a.failures.failed("w1", 7)
    assert mark is not None and mark.reason.startswith("two edges")
    assert await a.adopt() == []  # not news the second time
    assert await b.adopt() == []  # its own mark
    assert a.failures.failed("w1", 8) is None  # back under a new epoch: trusted again
    assert await a.adopt() == []  # and the old epoch's mark is not taken again


async def test_reports_of_an_earlier_incarnation_do_not_count_against_a_new_one(
    backend: Backend,
) -> None:
    book = backend.failures
    await book.suspect("w1", 4, "edge-a", "m1", 5)
    await book.suspect("w1", 4, "edge-b", "m2", 5)
    assert await book.suspect("w1", 5, "edge-c", "m9", 5) == [("edge-c", "m9")]  # restarted
    a = FailureSync(WorkerFailures(time.monotonic), backend.failures)
    assert await a.report("w1", 5, "edge-d", "m9") is False  # one machine of the new one


async def test_a_damaged_entry_in_redis_is_dropped_not_fatal_to_every_later_call(
    redis_server: Any,
) -> None:
    """Only Redis holds values of another form (another version's, or damaged): a
    script that failed on one would fail on every call after it."""
    url = await redis_server.flushed()
    raw = redis.Redis.from_url(url)
    await raw.hset(keys.worker_failures(), "w9", "not a mark")
    await raw.hset(keys.worker_failures(), "w8", "99999999999999 x reason")
    await raw.hset(keys.wake_claims("app"), "p9", "garbage")
    await raw.hset(keys.wake_demand("app"), "e9", "99999999999999 many")
    await raw.aclose()
    both = RedisCoordination(url)
    try:
        await both.mark_failed("w1", 2, "its agent does not answer", 5)
        assert [m.worker for m in await both.failed_workers()] == ["w1"]
        assert await both.others("app", "p1") == Claims()
        assert await both.report("app", "e1", 2, 5) == 2
    finally:
        await both.close()
