"""The reconciler's decision on hand-made inputs: every action with its reason, and that a
second pass over its own outcome issues nothing (and repeated passes converge)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.core.reconcile import (
    RUNNING,
    STANDBY,
    Action,
    Busy,
    CompleteRelease,
    Create,
    Declared,
    Destroy,
    FailRelease,
    Fence,
    HeldBack,
    Replace,
    Seen,
    Start,
    Unfence,
    creates_held_back,
    found_no_room,
    held_back,
    reconcile,
)

W = ("w1", "w2", "w3")


def m(mid: str, worker: str = "w1", state: str = "started", release: int = 1,
      live: bool = True) -> Seen:
    return Seen(mid, worker, state, release, live)


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


# -- min machines running ------------------------------------------------------------

def test_an_app_with_its_shape_needs_nothing() -> None:
    d = Declared(release=1, min_running=1, spares=1, max_machines=3)
    assert reconcile(d, [m("a"), m("b", "w2", "stopped")], workers=W) == []


def test_raising_min_running_starts_a_standby_on_another_worker() -> None:
    d = Declared(release=1, min_running=2, max_machines=3)
    actions = reconcile(d, [m("a"), m("s1", "w1", "stopped"), m("s2", "w2", "stopped")],
                        workers=W)
    assert actions == [Start("s2", "min_machines_running=2: 1 running")]


def test_a_standby_beside_the_running_machine_loses_to_a_new_machine_elsewhere() -> None:
    d = Declared(release=1, min_running=2, max_machines=3)
    actions = reconcile(d, [m("a"), m("s1", "w1", "stopped")], workers=W)
    assert actions == [Create(True, "min_machines_running=2: 1 running", frozenset({"w1"}))]


def test_with_one_worker_a_standby_beside_the_running_machine_is_started() -> None:
    d = Declared(release=1, min_running=2, max_machines=3)
    assert kinds(reconcile(d, [m("a"), m("s1", "w1", "stopped")], workers=["w1"])) == ["Start"]


def test_no_room_under_max_machines_means_the_shared_standby_is_started() -> None:
    d = Declared(release=1, min_running=2, max_machines=2)
    assert reconcile(d, [m("a"), m("s1", "w1", "stopped")], workers=W) == [
        Start("s1", "min_machines_running=2: 1 running")]


def test_min_running_creates_what_is_missing_within_max_machines() -> None:
    d = Declared(release=1, min_running=3, max_machines=2)
    actions = reconcile(d, [], workers=W)
    assert kinds(actions) == ["Create", "Create"]
    assert all(isinstance(a, Create) and a.start for a in actions)


def test_suspended_standbys_are_started_before_stopped_ones() -> None:
    d = Declared(release=1, min_running=1, max_machines=3)
    actions = reconcile(d, [m("b", "w2", "stopped"), m("c", "w3", "suspended")], workers=W)
    assert actions == [Start("c", "min_machines_running=1: 0 running")]


def test_machines_being_created_count_as_running() -> None:
    d = Declared(release=1, min_running=1, max_machines=3)
    assert reconcile(d, [], Busy(creating_running=1), workers=W) == []


# -- spares ----------------------------------------------------------------------------

def test_missing_spares_are_created_away_from_the_apps_workers() -> None:
    d = Declared(release=1, min_running=1, spares=2, max_machines=4)
    actions = reconcile(d, [m("a")], workers=W)
    assert actions == [Create(False, "spares=2: 0 standing by", frozenset({"w1"}))] * 2


def test_a_standby_taken_to_run_is_replaced_as_a_spare() -> None:
    d = Declared(release=1, min_running=1, spares=1, max_machines=3)
    actions = reconcile(d, [m("s", "w2", "stopped")], workers=W)
    assert kinds(actions) == ["Start", "Create"]
    assert isinstance(actions[1], Create) and not actions[1].start


def test_spares_never_pass_max_machines() -> None:
    d = Declared(release=1, min_running=1, spares=5, max_machines=2)
    assert kinds(reconcile(d, [m("a")], workers=W)) == ["Create"]


def test_lowering_spares_destroys_the_standby_made_for_them_but_no_other() -> None:
    spare = replace(m("s", "w2", "created"), for_spares=True)
    by_hand = m("h", "w3", "created")  # a wake's or an owner's standby: not the rule's
    stopped = m("t", "w3", "stopped")  # what scaling to zero left: a wake starts it
    d = Declared(release=1, min_running=1, spares=0, max_machines=5)
    actions = reconcile(d, [m("a"), spare, by_hand, stopped], workers=W)
    assert actions == [Destroy("s", "spares=0: 3 standing by")]
    again = reconcile(d, [m("a"), by_hand, stopped], workers=W)
    assert again == []  # converged: the others stay


def test_a_standby_made_for_spares_is_kept_while_the_app_is_short_of_running() -> None:
    spare = replace(m("s", "w2", "created"), for_spares=True)
    d = Declared(release=1, min_running=2, spares=0, max_machines=3)
    actions = reconcile(d, [m("a"), spare], workers=W)
    assert actions == [Start("s", "min_machines_running=2: 1 running")]


def test_a_rollouts_replacement_standby_is_not_trimmed_as_a_surplus_of_spares() -> None:
    new_spare = replace(m("n", "w2", "created", release=2), for_spares=True)
    old_spare = m("o", "w3", "created", release=1)
    d = Declared(release=2, min_running=1, spares=1, max_machines=4, rolling_out=True)
    actions = reconcile(d, [m("a", release=2), new_spare, old_spare],
                        Busy(machines=frozenset({"o"}), replacing=1), workers=W)
    assert not [a for a in actions if isinstance(a, Destroy) and a.machine == "n"]


def test_a_spare_reported_before_its_create_returned_is_not_counted_twice() -> None:
    # The agent reports the new standby (the feed's pass) before the create that made it
    # has answered the reconciler: counted as seen and as creating it was a surplus, and
    # destroyed; the next pass made another, and so on (spares churned under load).
    spare = replace(m("n", "w2", "created"), for_spares=True)
    d = Declared(release=1, min_running=1, spares=1, max_machines=3)
    assert reconcile(d, [m("a"), spare], Busy(creating_standby=1), workers=W) == []


def test_a_busy_spare_is_not_trimmed() -> None:
    spare = replace(m("s", "w2", "created"), for_spares=True)
    d = Declared(release=1, min_running=1, spares=0, max_machines=3)
    assert reconcile(d, [m("a"), spare], Busy(machines=frozenset({"s"}))) == []


# -- surplus ---------------------------------------------------------------------------

def test_lowering_max_machines_destroys_standbys_first() -> None:
    d = Declared(release=1, min_running=1, max_machines=2)
    machines = [m("a"), m("b", "w2"), m("c", "w3", "stopped"), m("d", "w3", "created")]
    actions = reconcile(d, machines, workers=W)
    assert actions == [Destroy("d", "max_machines=2: 4 machines"),
                       Destroy("c", "max_machines=2: 4 machines")]


def test_surplus_never_destroys_below_min_running() -> None:
    d = Declared(release=1, min_running=3, max_machines=2)
    machines = [m("a"), m("b", "w2"), m("c", "w3")]
    assert reconcile(d, machines, workers=W) == []


# -- host failure ----------------------------------------------------------------------

def test_machines_of_a_dead_worker_are_fenced_and_replaced() -> None:
    d = Declared(release=1, min_running=1, spares=1, max_machines=3)
    machines = [m("a", "w1", live=False), m("s", "w2", "stopped")]
    actions = reconcile(d, machines, workers=["w2", "w3"])
    assert actions[0] == Fence("a", "worker w1 is down: machine a is lost")
    # the spare runs now, and a new spare is made beside nothing of the app's
    assert actions[1:] == [Start("s", "min_machines_running=1: 0 running"),
                           Create(False, "spares=1: 0 standing by", frozenset({"w2"}))]


def test_a_fenced_machine_whose_worker_is_back_is_destroyed_and_never_counted() -> None:
    d = Declared(release=1, min_running=1, max_machines=3)
    machines = [m("a", "w1"), m("b", "w2")]
    actions = reconcile(d, machines, fenced={"a"}, workers=W)
    assert actions == [Destroy("a", "worker w1 is back: machine a was lost and is not used "
                                    "again")]


def test_a_fenced_machine_whose_worker_is_back_under_the_same_epoch_is_taken_back() -> None:
    d = Declared(release=1, min_running=1, max_machines=3)
    machines = [replace(m("a", "w1"), same_epoch=True), m("s", "w2", "stopped")]
    actions = reconcile(d, machines, fenced={"a"}, workers=W)
    assert actions == [Unfence("a", "worker w1 is back under the same epoch: machine a is "
                                    "taken back")]  # it runs: nothing is started for it


def test_a_machine_made_while_one_was_fenced_is_trimmed_when_that_one_is_taken_back() -> None:
    d = Declared(release=1, min_running=1, max_machines=1)
    machines = [replace(m("a", "w1"), same_epoch=True), m("b", "w2")]
    actions = reconcile(d, machines, fenced={"a"}, workers=W)
    assert kinds(actions) == ["Unfence", "Destroy"]
    assert actions[1] == Destroy("a", "max_machines=1: 2 machines")  # one of two stays


def test_a_fenced_machine_still_away_is_left_alone() -> None:
    d = Declared(release=1, min_running=1, max_machines=3)
    assert reconcile(d, [m("a", live=False), m("b", "w2")], fenced={"a"}, workers=W) == []


# -- releases --------------------------------------------------------------------------

def test_a_rolling_release_replaces_one_machine_at_a_time_running_ones_first() -> None:
    d = Declared(release=2, min_running=2, spares=1, max_machines=3, rolling_out=True)
    machines = [m("a"), m("b", "w2"), m("s", "w3", "stopped")]
    actions = reconcile(d, machines, workers=W)
    assert actions == [Replace("a", True, "release 2 replaces machine a of release 1")]
    busy = Busy(machines=frozenset({"a"}), replacing=1)
    assert reconcile(d, machines, busy, workers=W) == []


def test_max_unavailable_replaces_that_many_at_once() -> None:
    d = Declared(release=2, max_machines=3, max_unavailable=2, rolling_out=True)
    machines = [m("a"), m("b", "w2"), m("c", "w3", "stopped")]
    assert kinds(reconcile(d, machines, workers=W)) == ["Replace", "Replace"]


def test_an_immediate_release_replaces_every_machine_stopped_ones_too() -> None:
    d = Declared(release=2, strategy="immediate", max_machines=3, rolling_out=True)
    machines = [m("a"), m("b", "w2", "stopped"), m("c", "w3", "created")]
    actions = reconcile(d, machines, workers=W)
    assert [(a.machine, a.start) for a in actions if isinstance(a, Replace)] == [
        ("a", True), ("b", False), ("c", False)]


def test_a_canary_goes_alone_until_it_has_started() -> None:
    d = Declared(release=2, strategy="canary", max_machines=4, rolling_out=True)
    machines = [m("a"), m("b", "w2"), m("c", "w3")]
    assert kinds(reconcile(d, machines, workers=W)) == ["Replace"]
    after = [m("n", "w1", release=2), m("b", "w2"), m("c", "w3")]
    assert kinds(reconcile(d, after, workers=W)) == ["Replace", "Replace"]


def test_a_failed_machine_of_the_release_fails_it() -> None:
    d = Declared(release=2, max_machines=3, rolling_out=True)
    machines = [m("a"), m("n", "w2", "failed", release=2)]
    assert reconcile(d, machines, workers=W) == [
        FailRelease(2, "machine n of release 2 failed")]


def test_failed_machines_of_an_older_release_are_destroyed() -> None:
    d = Declared(release=2, max_machines=3)
    actions = reconcile(d, [m("a", state="failed")], workers=W)
    assert actions == [Destroy("a", "machine a of release 1 failed; release 2 replaces it")]


def test_a_failed_machine_of_the_current_release_is_destroyed_with_its_last_output() -> None:
    d = Declared(release=2, min_running=1, max_machines=3)
    why = "image hello:v2: no_space; last output:\ncannot open the flux capacitor"
    failed = replace(m("f", "w2", "failed", release=2), reason=why)
    actions = reconcile(d, [m("a", release=2), failed], workers=W)
    assert actions == [Destroy("f", f"machine f of release 2 failed: {why}; it is replaced",
                               failed=True)]


def test_failed_machines_do_not_hold_places_under_max_machines() -> None:
    """The disk case: creates that failed filled max_machines and the app stayed below its
    minimum; now they are destroyed and the minimum is made up at once."""
    d = Declared(release=1, min_running=3, max_machines=4)
    machines = [m("a"), m("f1", "w2", "failed"), m("f2", "w2", "failed"),
                m("f3", "w3", "failed")]
    actions = reconcile(d, machines, workers=W)
    assert kinds(actions) == ["Destroy"] * 3 + ["Create"] * 2
    assert all(isinstance(a, Destroy) and a.failed for a in actions[:3])
    busy = Busy(machines=frozenset({"f1", "f2", "f3"}),
                destroying=frozenset({"f1", "f2", "f3"}), creating_running=2)
    assert reconcile(d, machines, busy, workers=W) == []  # nothing twice


def test_a_failed_machine_already_being_destroyed_is_left_to_that() -> None:
    d = Declared(release=1, min_running=1, max_machines=2)
    busy = Busy(machines=frozenset({"f"}))
    assert reconcile(d, [m("a"), m("f", "w2", "failed")], busy, workers=W) == []


def test_a_failed_machine_of_a_release_rolling_out_fails_it_and_is_not_destroyed() -> None:
    d = Declared(release=2, min_running=1, max_machines=3, rolling_out=True)
    actions = reconcile(d, [m("a"), m("f", "w2", "failed", release=2)], workers=W)
    assert kinds(actions) == ["FailRelease"]


def test_a_release_with_no_older_machine_left_is_complete() -> None:
    d = Declared(release=2, min_running=1, max_machines=3, rolling_out=True)
    assert reconcile(d, [m("n", release=2)], workers=W) == [
        CompleteRelease(2, "every machine runs release 2")]


def test_old_running_machines_count_for_min_running_while_they_are_replaced() -> None:
    d = Declared(release=2, min_running=1, max_machines=2, rolling_out=True)
    actions = reconcile(d, [m("a")], workers=W)
    assert kinds(actions) == ["Replace"]  # no second running machine besides


# -- properties ------------------------------------------------------------------------

STATES = ("created", "starting", "started", "stopped", "suspended", "failed", "destroying")


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Declared, list[Seen], frozenset[str]]:
    release = draw(st.integers(1, 3))
    max_machines = draw(st.integers(1, 6))
    declared = Declared(
        release=release,
        min_running=draw(st.integers(0, max_machines)),
        spares=draw(st.integers(0, 3)),
        max_machines=max_machines,
        strategy=draw(st.sampled_from(["rolling", "immediate", "canary"])),
        max_unavailable=draw(st.integers(1, 3)),
        rolling_out=draw(st.booleans()),
    )
    count = draw(st.integers(0, 7))
    machines = [
        Seen(f"m{i}", draw(st.sampled_from(W)), draw(st.sampled_from(STATES)),
             draw(st.integers(1, release)), draw(st.booleans()) or draw(st.booleans()))
        for i in range(count)
    ]
    fenced = frozenset(x.id for x in machines if not x.live and draw(st.booleans()))
    return declared, machines, fenced


def in_flight(declared: Declared, busy: Busy, fenced: frozenset[str],
              actions: list[Action]) -> tuple[Declared, Busy, frozenset[str]]:
    """What the shell marks while it carries the actions out."""
    ids, starting, destroying = set(busy.machines), set(busy.starting), set(busy.destroying)
    running, standby, replacing = busy.creating_running, busy.creating_standby, busy.replacing
    for a in actions:
        if isinstance(a, Start):
            ids.add(a.machine)
            starting.add(a.machine)
        elif isinstance(a, Destroy):
            ids.add(a.machine)
            destroying.add(a.machine)
        elif isinstance(a, Replace):
            ids.add(a.machine)
            replacing += 1
        elif isinstance(a, Create):
            running += a.start
            standby += not a.start
        elif isinstance(a, Fence):
            fenced = fenced | {a.machine}
        elif isinstance(a, Unfence):
            fenced = fenced - {a.machine}
        elif isinstance(a, CompleteRelease):
            declared = replace(declared, rolling_out=False)
    return declared, Busy(frozenset(ids), frozenset(starting), frozenset(destroying), running,
                          standby, replacing), fenced


@settings(max_examples=400, deadline=None)
@given(worlds())
def test_a_second_pass_over_its_own_outcome_issues_nothing(
    world: tuple[Declared, list[Seen], frozenset[str]],
) -> None:
    declared, machines, fenced = world
    first = reconcile(declared, machines, fenced=fenced, workers=W)
    if any(isinstance(a, FailRelease) for a in first):
        return  # the shell goes back to the previous release at once (see the shell tests)
    declared2, busy, fenced2 = in_flight(declared, Busy(), fenced, first)
    assert reconcile(declared2, machines, busy, fenced2, workers=W) == []


def carried_out(declared: Declared, machines: list[Seen], fenced: frozenset[str],
                actions: list[Action], serial: list[int]) -> tuple[
                    Declared, list[Seen], frozenset[str]]:
    """Every action done: what the agents would then report."""
    by_id = {x.id: x for x in machines}
    placed: set[str] = set()  # the shell avoids, too, the workers it placed on in this pass

    def new(start: bool, avoid: frozenset[str]) -> None:
        serial[0] += 1
        worker = next((w for w in W if w not in avoid | placed), W[0])
        placed.add(worker)
        mid = f"n{serial[0]}"
        by_id[mid] = Seen(mid, worker, "started" if start else "created", declared.release)

    for a in actions:
        if isinstance(a, Start):
            by_id[a.machine] = replace(by_id[a.machine], state="started")
        elif isinstance(a, Destroy):
            del by_id[a.machine]
        elif isinstance(a, Create):
            new(a.start, a.avoid)
        elif isinstance(a, Replace):
            new(a.start, a.avoid)
            del by_id[a.machine]
        elif isinstance(a, Fence):
            fenced = fenced | {a.machine}
        elif isinstance(a, CompleteRelease):
            declared = replace(declared, rolling_out=False)
    return declared, list(by_id.values()), fenced


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_passes_carried_out_converge_to_the_declared_shape(
    world: tuple[Declared, list[Seen], frozenset[str]],
) -> None:
    declared, machines, fenced = world
    # a machine failed in this release stops the rollout (tested above); here none has
    machines = [x for x in machines if not (x.state == "failed" and x.release ==
                                            declared.release)]
    serial = [0]
    surplus = False  # a surplus is destroyed standbys first, spread or not
    for _ in range(30):
        actions = reconcile(declared, machines, fenced=fenced, workers=W)
        if not actions:
            break
        surplus |= any(isinstance(a, Destroy) and a.reason.startswith("max_machines")
                       for a in actions)
        declared, machines, fenced = carried_out(declared, machines, fenced, actions, serial)
    else:
        raise AssertionError(f"no fixpoint: {actions}")
    counted = [x for x in machines if x.live and x.id not in fenced and x.state not in
               ("destroying", "destroyed")]
    assert all(x.release == declared.release for x in counted)
    assert not declared.rolling_out
    running = [x for x in counted if x.state in RUNNING]
    standby = [x for x in counted if x.state in STANDBY]
    assert len(running) >= min(declared.min_running, declared.max_machines)
    if len(running) <= declared.max_machines:
        assert len(counted) <= max(declared.max_machines, len(running))
    assert len(standby) >= min(declared.spares,
                               max(0, declared.max_machines - len(running) - sum(
                                   1 for x in counted if x.state == "failed")))
    # machines that must run or stand by are on distinct workers where the region allows
    shaped = running + standby
    original = any(x.state in RUNNING | STANDBY for x in machines if x.id.startswith("m"))
    if not surplus and len(shaped) <= len(W) and not original:
        assert len({x.worker for x in shaped}) == len(shaped)


def test_creates_that_found_no_room_wait_doubling_until_the_workers_change() -> None:
    workers = frozenset(W)
    first = found_no_room(None, workers, now=100.0)
    assert (first.until, first.wait_s) == (101.0, 1.0)
    assert creates_held_back(first, workers, 100.5)
    assert not creates_held_back(first, workers, 101.0)  # its wait is over: try again
    waits = []
    stand = first
    for _ in range(7):
        stand = found_no_room(stand, workers, now=200.0)
        waits.append(stand.wait_s)
    assert waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    more = frozenset({*W, "w4"})
    assert not creates_held_back(stand, more, 200.5)  # a new worker may have room
    assert found_no_room(stand, more, now=300.0).wait_s == 1.0
    assert not creates_held_back(None, workers, 0.0)


def test_machines_that_did_not_come_up_hold_back_replacements_too_no_room_only_creates() -> None:
    """A release that cannot start, with nothing to roll back to (a rollback keeps
    secrets), must not replace and fail machines as fast as the host can."""
    workers = frozenset(W)
    no_room = found_no_room(None, workers, now=100.0)
    failing = found_no_room(found_no_room(None, workers, now=100.0), workers, now=100.0)
    assert held_back(no_room, None, workers, 100.5) == HeldBack(101.0, replacements=False)
    assert held_back(None, failing, workers, 100.5) == HeldBack(102.0, replacements=True)
    assert held_back(no_room, failing, workers, 101.5) == HeldBack(102.0, replacements=True)
    assert held_back(no_room, failing, workers, 102.0) is None  # both waits are over
    assert held_back(None, None, workers, 0.0) is None



def test_a_machines_crashes_and_failures_are_news_once_and_its_past_is_not() -> None:
    from placement.core.ends import MachineEnd, new_ends

    first = {"m1": [(1.0, "start", ""), (2.0, "crash", "oom")]}
    ends, seen = new_ends(first, {})
    assert ends == [] and seen == {"m1": 2.0}  # first seen: its past is not news
    later = {"m1": [(2.0, "crash", "oom"), (3.0, "start", ""), (4.0, "crash", "exited(1)"),
                    (5.0, "fail", "crashed 6 times in 60s")]}
    ends, seen = new_ends(later, seen)
    assert ends == [MachineEnd("m1", 4.0, "crash", "exited(1)"),
                    MachineEnd("m1", 5.0, "fail", "crashed 6 times in 60s")]
    again, seen = new_ends(later, seen)
    assert again == [] and seen == {"m1": 5.0}
    assert new_ends({}, seen) == ([], {})  # gone machines are forgotten
