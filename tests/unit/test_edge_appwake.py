"""The cold path's core: effects of hand-made event sequences, and a property test that
every held request ends in exactly one answer whatever the interleaving."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from edge.core.appwake import AppWakes, Shape, machines_to_start
from edge.core.wakeeffects import ArmTimer, CallPlacement, Effect, Fail, Release, Shed, Wake

COLD = Shape(started=0, in_flight=0, free=0, soft_limit=20, max_machines=100,
             hold_timeout_s=30.0, max_pending=1000)


def kinds(effects: list[Effect[str]]) -> list[str]:
    return [type(e).__name__ for e in effects]


def only(effects: list[Effect[str]], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in effects if isinstance(e, kind)]


# -- the formula -------------------------------------------------------------------------


def test_a_burst_of_1000_at_soft_limit_20_asks_for_exactly_50_machines() -> None:
    assert machines_to_start(1000, 0, 20, 100) == 50
    assert machines_to_start(1000, 0, 20, 3) == 3
    assert machines_to_start(1000, 10, 20, 100) == 40
    assert machines_to_start(10, 1, 20, 100) == 0


@given(st.integers(0, 5000), st.integers(0, 200), st.integers(1, 100), st.integers(0, 200))
def test_the_ask_never_exceeds_the_cap_and_covers_the_demand(
    demand: int, started: int, soft: int, cap: int,
) -> None:
    count = machines_to_start(demand, started, soft, cap)
    assert 0 <= count <= max(0, cap - started)
    if count < cap - started:
        assert (started + count) * soft >= demand


# -- sequences ---------------------------------------------------------------------------


def test_the_first_held_request_wakes_once_and_arms_its_deadline() -> None:
    core: AppWakes[str] = AppWakes(100)
    effects = core.hold("app", "r1", 10.0, COLD)
    assert kinds(effects) == ["CallPlacement", "ArmTimer"]
    call = only(effects, CallPlacement)[0]
    assert (call.app, call.count, call.deadline_ms) == ("app", 1, 30_000)
    assert only(effects, ArmTimer) == [ArmTimer("app", 40.0)]
    # a second request while the wake is in flight: no second wake, no new timer
    assert core.hold("app", "r2", 11.0, COLD) == []
    assert core.held("app") == 2


def test_the_wake_answer_releases_held_requests_with_its_timings() -> None:
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "r1", 10.0, COLD), CallPlacement)[0].wake
    core.hold("app", "r2", 10.5, COLD)
    warm = replace(COLD, started=1, free=10)
    effects = core.on_wake_answer(wake, 11.0, warm, added=1, place_ms=5, pull_ms=0,
                                  boot_ms=80)
    release = only(effects, Release)[0]
    assert [(r.item, r.hold_s, r.wake) for r in release.items] == [
        ("r1", 1.0, wake), ("r2", 0.5, wake)]
    assert (wake.place_ms, wake.pull_ms, wake.boot_ms) == (5, 0, 80)
    assert only(effects, ArmTimer) == [ArmTimer("app", None)]  # nothing left to time
    assert core.total == 0


def test_a_machine_from_the_registry_feed_releases_at_once_with_estimated_timings() -> None:
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "r1", 10.0, COLD), CallPlacement)[0].wake
    effects = core.on_machine_added("app", 10.2, replace(COLD, started=1, free=20),
                                    boot_ms=150.0)
    [released] = only(effects, Release)[0].items
    assert released.item == "r1" and released.wake is wake
    assert round(wake.boot_ms) == 150 and round(wake.place_ms) == 50  # 200 ms since sent
    # placement's answer, coming after, replaces the estimate for whoever reads it later
    core.on_wake_answer(wake, 10.25, replace(COLD, started=1, free=19), 1, 30, 20, 140)
    assert (wake.place_ms, wake.pull_ms, wake.boot_ms) == (30, 20, 140)


def test_room_left_by_another_request_releases_without_a_wake_to_credit() -> None:
    core: AppWakes[str] = AppWakes(100)
    busy = replace(COLD, started=1, in_flight=20, free=0)
    effects = core.hold("app", "r1", 10.0, busy)
    assert kinds(effects) == ["CallPlacement", "ArmTimer"]  # 21 requests need 2 machines
    assert only(effects, CallPlacement)[0].count == 1
    released = only(core.on_capacity("app", 10.1, replace(busy, free=1)), Release)[0].items
    assert released[0].wake is None


def test_the_deadline_timer_answers_504_and_the_timer_fires_only_where_armed() -> None:
    core: AppWakes[str] = AppWakes(100)
    core.hold("app", "r1", 0.0, replace(COLD, hold_timeout_s=2.0))
    core.hold("app", "r2", 1.0, replace(COLD, hold_timeout_s=2.0))
    effects = core.on_timer("app", 2.0, COLD)
    fail = only(effects, Fail)[0]
    assert (fail.items, fail.waits, fail.code) == (["r1"], [2.0], "hold_timeout")
    assert only(effects, ArmTimer) == [ArmTimer("app", 3.0)]


def test_the_clients_own_timeout_shortens_the_deadline_and_a_rehold_keeps_the_first() -> None:
    core: AppWakes[str] = AppWakes(100)
    effects = core.hold("app", "r1", 0.0, COLD, client_timeout_s=0.5)
    assert only(effects, ArmTimer) == [ArmTimer("app", 0.5)]
    late = core.hold("other", "r2", 40.0, COLD, since=5.0)  # held first at 5: 30 s spent
    assert only(late, Fail)[0].code == "hold_timeout"


def test_queue_full_edge_full_and_auto_start_off_answer_at_once() -> None:
    core: AppWakes[str] = AppWakes(2)
    assert only(core.hold("a", "1", 0.0, replace(COLD, max_pending=0)), Fail)[0].code == \
        "queue_full"
    core.hold("a", "1", 0.0, COLD)
    core.hold("b", "2", 0.0, COLD)
    assert only(core.hold("c", "3", 0.0, COLD), Fail)[0].code == "edge_full"
    off = replace(COLD, auto_start=False)
    assert only(core.hold("d", "4", 0.0, off), Fail)[0].code == "auto_start_off"


def test_a_failed_wake_answers_everyone_held_unless_machines_may_still_come() -> None:
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "r1", 0.0, COLD), CallPlacement)[0].wake
    core.hold("app", "r2", 0.1, COLD)
    effects = core.on_wake_failed(wake, 0.2, COLD, "no_capacity", "no worker has room")
    fail = only(effects, Fail)[0]
    assert (fail.items, fail.code, fail.detail) == (
        ["r1", "r2"], "no_capacity", "wake failed: no worker has room")
    # "deadline": the machines are still booting; the requests wait out their deadlines
    assert only(core.hold("app", "r3", 1.0, COLD), CallPlacement) == []  # backing off
    wake = only(core.on_timer("app", 1.2, COLD), CallPlacement)[0].wake
    assert only(core.on_wake_failed(wake, 1.3, COLD, "deadline", "slow"), Fail) == []
    assert core.held("app") == 1


def test_after_a_failed_or_empty_wake_the_next_one_waits_for_the_backoff_timer() -> None:
    core: AppWakes[str] = AppWakes(100, backoff_s=1.0)
    wake = only(core.hold("app", "r1", 0.0, COLD), CallPlacement)[0].wake
    effects = core.on_wake_answer(wake, 0.5, COLD, added=0, place_ms=1, pull_ms=0, boot_ms=0)
    assert only(effects, CallPlacement) == []
    assert only(effects, ArmTimer) == [ArmTimer("app", 1.5)]  # earlier than the 30 s deadline
    assert only(core.on_machine_lost("app", 1.0, COLD), CallPlacement) == []  # still backing off
    effects = core.on_timer("app", 1.5, COLD)
    assert len(only(effects, CallPlacement)) == 1
    assert only(effects, ArmTimer) == [ArmTimer("app", 30.0)]


def test_a_burst_asks_again_for_what_the_first_wake_did_not_cover() -> None:
    core: AppWakes[str] = AppWakes(10_000)
    wake = only(core.hold("app", "r0", 0.0, COLD), CallPlacement)[0].wake
    for n in range(1, 1000):
        assert only(core.hold("app", f"r{n}", 0.001, COLD), CallPlacement) == []
    # one machine came (20 requests go to it), 980 are left: 49 more are asked for
    one = replace(COLD, started=1, free=20)
    effects = core.on_wake_answer(wake, 0.1, one, added=1, place_ms=1, pull_ms=0, boot_ms=1)
    assert len(only(effects, Release)[0].items) == 20
    calls = only(effects, CallPlacement)
    assert [c.count for c in calls] == [49]


def test_each_wake_says_the_demand_here_for_placement_to_sum_over_edges() -> None:
    core: AppWakes[str] = AppWakes(10_000)
    first = only(core.hold("app", "r0", 0.0, COLD), CallPlacement)[0]
    assert (first.count, first.demand) == (1, 1)
    for n in range(1, 100):
        core.hold("app", f"r{n}", 0.001, COLD)
    # the machine that came is another edge's as much as this one's: 30 go to it here,
    # and the next wake says all 100 (in flight and held), whatever it counts as started
    one = replace(COLD, started=1, free=30)
    effects = core.on_wake_answer(first.wake, 0.1, one, added=1, place_ms=1, pull_ms=0,
                                  boot_ms=1)
    again = only(effects, CallPlacement)
    assert [(c.count, c.demand) for c in again] == [(4, 100)]


def test_other_edges_requests_at_the_machines_count_in_the_ask_but_not_in_the_demand() -> None:
    # Two edges, a burst of 100 each; the first wakes were sized from its first requests and
    # started 5 machines (hard_limit 30, 150 slots). Here: 75 in flight and 25 held, and
    # 75 of the other edge's at the same machines. Counting only its own (100), 4 machines
    # look enough and it would never ask again; with the others' it asks, saying its own.
    core: AppWakes[str] = AppWakes(10_000)
    full = replace(COLD, started=5, in_flight=75, free=0, soft_limit=25)
    for n in range(25):
        assert only(core.hold("app", f"r{n}", 0.0, full), CallPlacement) == []
    core2: AppWakes[str] = AppWakes(10_000)
    shared = replace(full, elsewhere=75)
    calls = only(core2.hold("app", "r0", 0.0, shared), CallPlacement)
    assert [(c.count, c.demand) for c in calls] == [(2, 76)]  # ceil(151/25) - 5; 75 + 1 here


def test_others_load_growing_on_full_machines_asks_for_a_wake_for_what_is_held() -> None:
    core: AppWakes[str] = AppWakes(10_000)
    alone = replace(COLD, started=5, in_flight=75, free=0, soft_limit=25)
    for n in range(25):  # the others' load not yet shared: 100 fit 5 machines
        assert only(core.hold("app", f"r{n}", 0.0, alone), CallPlacement) == []
    # the load share counts the other edge's 75: the held 25 call for 2 more machines
    effects = core.on_capacity("app", 0.25, replace(alone, elsewhere=75))
    assert [(c.count, c.demand) for c in only(effects, CallPlacement)] == [(2, 100)]
    assert only(core.on_capacity("app", 0.5, replace(alone, elsewhere=75)),
                CallPlacement) == []  # one wake in flight at a time


def test_requests_the_edges_together_put_past_the_hard_limit_ask_for_a_wake_unheld() -> None:
    # Two edges, 100 each, 5 machines (hard_limit 30: 150 slots): each admitted its 100 on
    # a stale count of the other's, nothing is held, and the machines carry 200. The load
    # share shows the other's 100: 50 past the hard limit, as one edge would have held.
    core: AppWakes[str] = AppWakes(10_000)
    crowded = replace(COLD, started=5, in_flight=100, free=0, soft_limit=25,
                      elsewhere=100, over=50)
    calls = only(core.on_capacity("app", 0.25, crowded), CallPlacement)
    assert [(c.count, c.demand) for c in calls] == [(3, 100)]  # ceil(200/25) - 5; its own
    assert only(core.on_capacity("app", 0.5, crowded), CallPlacement) == []  # in flight
    core.on_wake_answer(calls[0].wake, 1.0, crowded, added=0, place_ms=0, pull_ms=0,
                        boot_ms=0)
    assert only(core.on_capacity("app", 1.5, crowded), CallPlacement) == []  # backing off
    # within the hard limit (above the soft one), nothing held: no wake, as with one edge
    fits = replace(crowded, elsewhere=40, over=0)
    assert core.on_capacity("other", 0.25, fits) == []


def test_a_machine_appearing_ends_the_backoff_of_an_app_with_requests_held() -> None:
    core: AppWakes[str] = AppWakes(100, backoff_s=1.0)
    wake = only(core.hold("app", "r1", 0.0, COLD), CallPlacement)[0].wake
    core.hold("app", "r2", 0.0, COLD)
    # placement: nothing to start here, other wakes are starting enough
    assert only(core.on_wake_answer(wake, 0.1, COLD, added=0, place_ms=0, pull_ms=0,
                                    boot_ms=0), CallPlacement) == []
    # another edge's machine shows up full (no room for these two): ask again now, not
    # after the backoff, with what is held here
    full = replace(COLD, started=1, in_flight=20, free=0)
    calls = only(core.on_machine_added("app", 0.3, full), CallPlacement)
    assert [(c.count, c.demand) for c in calls] == [(1, 22)]


def test_a_deleted_app_gets_404_for_its_held_requests_and_shutdown_answers_all() -> None:
    core: AppWakes[str] = AppWakes(100)
    core.hold("gone", "r1", 0.0, COLD)
    core.hold("kept", "r2", 0.0, COLD)
    effects = core.app_deleted("gone", 1.0)
    assert only(effects, Fail)[0].code == "unknown_app"
    assert only(effects, ArmTimer) == [ArmTimer("gone", None)]
    effects = core.shutdown(2.0)
    assert [(f.items, f.code) for f in only(effects, Fail)] == [(["r2"], "shutting_down")]
    assert core.total == 0


def test_a_forgotten_request_is_never_answered() -> None:
    core: AppWakes[str] = AppWakes(100)
    core.hold("app", "r1", 0.0, COLD)
    assert core.forget("app", "r1") and not core.forget("app", "r1")
    assert only(core.on_timer("app", 31.0, COLD), Fail) == []


# -- deadline-aware admission -------------------------------------------------------------


def test_a_prediction_sheds_at_once_the_held_requests_whose_deadline_comes_first() -> None:
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "short", 10.0, COLD, client_timeout_s=2.0),
                CallPlacement)[0].wake
    core.hold("app", "long", 10.0, COLD, client_timeout_s=20.0)
    core.hold("app", "default", 10.5, COLD)  # the app's 30 s
    # placement: first machine ready 5.2 s after the wake was sent (at 10.0): 15.2
    effects = core.on_wake_predicted(wake, 10.3, 5200.0)
    [shed] = only(effects, Shed)
    assert (shed.items, shed.retry_after_s) == (["short"], 5)  # ceil(15.2 - 10.3)
    assert round(shed.waits[0], 3) == 0.3 and round(shed.wait_s, 3) == 4.9
    assert core.held("app") == 2  # the others wait, and are served by the answer
    release = only(core.on_wake_answer(wake, 15.0, replace(COLD, started=1, free=25), 1,
                                       1.0, 0.0, 5000.0), Release)[0]
    assert [r.item for r in release.items] == ["long", "default"]


def test_a_request_past_its_deadline_when_the_prediction_comes_times_out_not_sheds() -> None:
    """Its timer is due but has not fired yet: it ran out of time, which is a 504."""
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "1ms", 10.0, COLD, client_timeout_s=0.001),
                CallPlacement)[0].wake
    core.hold("app", "short", 10.0, COLD, client_timeout_s=2.0)
    effects = core.on_wake_predicted(wake, 10.004, 5200.0)
    [timed_out] = only(effects, Fail)
    assert (timed_out.items, timed_out.code) == (["1ms"], "hold_timeout")
    assert only(effects, Shed)[0].items == ["short"]


def test_a_request_arriving_while_a_prediction_stands_is_checked_at_arrival() -> None:
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "first", 0.0, COLD), CallPlacement)[0].wake
    assert core.on_wake_predicted(wake, 0.1, 8000.0) == []  # 30 s is enough
    [shed] = only(core.hold("app", "hurried", 2.0, COLD, client_timeout_s=1.5), Shed)
    assert shed.items == ["hurried"] and shed.retry_after_s == 6  # ceil(8 - 2)
    assert core.held("app") == 1
    assert kinds(core.hold("app", "patient", 2.0, COLD, client_timeout_s=7.0)) == ["ArmTimer"]
    assert core.held("app") == 2


def test_a_prediction_shorter_than_every_budget_or_already_past_sheds_nothing() -> None:
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "r1", 0.0, COLD, client_timeout_s=3.0), CallPlacement)[0].wake
    assert core.on_wake_predicted(wake, 0.1, 2500.0) == []
    # the prediction was too hopeful: the machine is late; arriving requests are held
    assert only(core.hold("app", "r2", 2.8, COLD, client_timeout_s=0.5), Shed) == []
    assert core.held("app") == 2


def test_a_prediction_for_a_wake_no_longer_in_flight_is_ignored() -> None:
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "r1", 0.0, COLD, client_timeout_s=1.0), CallPlacement)[0].wake
    core.on_wake_failed(wake, 0.2, COLD, "deadline", "slow")
    assert core.on_wake_predicted(wake, 0.3, 60_000.0) == []
    assert core.held("app") == 1


def test_a_request_with_room_to_go_to_is_never_shed() -> None:
    core: AppWakes[str] = AppWakes(100)
    busy = replace(COLD, started=1, in_flight=20, free=0)
    wake = only(core.hold("app", "r1", 0.0, busy), CallPlacement)[0].wake
    core.on_wake_predicted(wake, 0.1, 60_000.0)
    effects = core.hold("app", "r2", 0.2, replace(busy, free=1), client_timeout_s=1.0)
    assert only(effects, Shed) == [] and [r.item for r in only(effects, Release)[0].items] \
        == ["r2"]


def test_the_wake_measures_its_prediction_against_its_first_machine() -> None:
    core: AppWakes[str] = AppWakes(100)
    wake = only(core.hold("app", "r1", 10.0, COLD), CallPlacement)[0].wake
    assert wake.measured_ms() == (-1, -1)
    core.on_wake_predicted(wake, 10.1, 2000.0)
    core.on_machine_added("app", 12.5, replace(COLD, started=1, free=20), boot_ms=100.0)
    core.on_wake_answer(wake, 13.0, replace(COLD, started=2, free=40), 2, 1.0, 0.0, 100.0)
    predicted, ready = wake.measured_ms()
    assert round(predicted) == 2000 and round(ready) == 2500


# -- every held request ends exactly once -------------------------------------------------

EVENTS = st.lists(st.tuples(
    st.sampled_from(["request", "answer", "empty_answer", "wake_failed", "deadline_failed",
                     "machine_added", "machine_lost", "request_ended", "client_gone",
                     "timer", "predicted"]),
    st.integers(0, 3), st.floats(0.0, 2.0)), max_size=60)


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_every_held_request_ends_in_exactly_one_answer(
    events: list[tuple[str, int, float]],
) -> None:
    core: AppWakes[int] = AppWakes(max_held_total=25, backoff_s=0.5)
    now = 0.0
    started = in_flight = 0
    capacity = 2  # hard limit per machine
    wakes: list[Wake] = []
    timer: float | None = None
    held: set[int] = set()
    ever_held: set[int] = set()
    answered: dict[int, str] = {}
    gone: set[int] = set()
    forwarded: list[int] = []
    counter = 0

    def shape() -> Shape:
        return Shape(started=started, in_flight=in_flight,
                     free=max(0, started * capacity - in_flight), soft_limit=1,
                     max_machines=3, hold_timeout_s=3.0, max_pending=10)

    def apply(effects: list[Effect[int]]) -> None:
        nonlocal in_flight, timer
        for effect in effects:
            if isinstance(effect, CallPlacement):
                assert effect.count >= 1 and not any(w is effect.wake for w in wakes)
                wakes.append(effect.wake)
            elif isinstance(effect, Release):
                assert len(effect.items) <= shape().free
                for released in effect.items:
                    assert released.item in held, "released a request not held"
                    held.discard(released.item)
                    answered[released.item] = "released"
                    forwarded.append(released.item)
                    in_flight += 1
            elif isinstance(effect, Fail | Shed):
                for item in effect.items:
                    assert item not in answered, f"{item} answered twice"
                    held.discard(item)
                    answered[item] = effect.code if isinstance(effect, Fail) else "predicted"
            elif isinstance(effect, ArmTimer):
                timer = effect.at

    for kind, n, step in events:
        now += step
        if kind == "request":
            counter += 1
            if shape().free > 0:
                in_flight += 1  # the shell forwards it; it is never held
                continue
            held.add(counter)
            ever_held.add(counter)
            apply(core.hold("app", counter, now, shape()))
        elif kind in ("answer", "empty_answer", "wake_failed", "deadline_failed") and wakes:
            wake = wakes.pop(0)
            if kind == "answer":
                started = min(3, started + 1 + n % 2)
                apply(core.on_wake_answer(wake, now, shape(), 1, 1.0, 0.0, 1.0))
            elif kind == "empty_answer":
                apply(core.on_wake_answer(wake, now, shape(), 0, 1.0, 0.0, 1.0))
            else:
                code = "deadline" if kind == "deadline_failed" else "start_failed"
                apply(core.on_wake_failed(wake, now, shape(), code, "x"))
        elif kind == "machine_added" and started < 3:
            started += 1
            apply(core.on_machine_added("app", now, shape(), boot_ms=1.0))
        elif kind == "machine_lost" and started:
            started -= 1
            in_flight = min(in_flight, started * capacity)
            apply(core.on_machine_lost("app", now, shape()))
        elif kind == "request_ended" and in_flight:
            in_flight -= 1
            apply(core.on_capacity("app", now, shape()))
        elif kind == "client_gone" and held:
            victim = sorted(held)[n % len(held)]
            assert core.forget("app", victim)
            held.discard(victim)
            gone.add(victim)
        elif kind == "timer" and timer is not None and now >= timer:
            apply(core.on_timer("app", now, shape()))
        elif kind == "predicted" and wakes:
            apply(core.on_wake_predicted(wakes[0], now, n * 1000.0 * step))
    # run the clock out: every request still held ends by its deadline's timer
    for _ in range(10):
        if timer is None:
            break
        now = max(now, timer)
        apply(core.on_timer("app", now, shape()))
    assert not held, f"still held with no timer: {held}"
    assert core.total == 0
    assert set(answered) | gone == ever_held  # each held request: one answer, or its client left
    assert not set(answered) & gone
    assert len(forwarded) == len(set(forwarded))
    assert set(answered.values()) <= {"released", "hold_timeout", "start_failed", "queue_full",
                                      "edge_full", "predicted"}
