"""The agent state is a pure replay of its records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.machine import IllegalTransition, MachineEvent, MachineState, next_state
from agent.core.offers import (
    Accept,
    Capacity,
    Decline,
    accepted_records,
    decide_offer,
    decide_start,
)
from agent.core.records import (
    Boot,
    Created,
    Fenced,
    Gone,
    Guest,
    Launched,
    MachineSpec,
    Record,
    Transition,
)
from agent.core.restart import GiveUp, Restart, RestartPolicy, after_crash
from agent.core.state import (
    RESUMED,
    AgentState,
    replay,
    snapshot,
    stale_fence,
    thawed,
    thaws,
)

SPEC = MachineSpec(app="hello", image="img", guest=Guest(cpus=1, memory_mb=256))


def test_replay_gives_the_machine_its_last_state_and_process() -> None:
    state = replay(
        [
            Boot(1, 0.0),
            Created("m1", SPEC, "k1", 1.0),
            Transition("m1", "start", "starting", 2.0),
            Launched("m1", 42, 7, 4000, 2.5),
            Transition("m1", "ready", "started", 3.0),
        ]
    )
    machine = state.machines["m1"]
    assert machine.state is MachineState.STARTED
    assert machine.process is not None and machine.process.pid == 42
    assert state.offers == {"k1": "m1"} and state.epoch == 1


def test_a_destroyed_machine_leaves_the_state_and_frees_its_reservation() -> None:
    state = replay(
        [
            Created("m1", SPEC, "k1", 1.0),
            Transition("m1", "destroy", "destroying", 2.0),
            Gone("m1", 2.5),
            Transition("m1", "destroyed", "destroyed", 3.0),
        ]
    )
    assert state.machines == {} and state.reserved() == (0, 0)


def test_crashes_are_counted_until_the_machine_is_asked_to_start_again() -> None:
    state = replay(
        [
            Created("m1", SPEC, "", 1.0),
            Transition("m1", "start", "starting", 2.0),
            Transition("m1", "ready", "started", 3.0),
            Transition("m1", "crash", "starting", 4.0),
            Transition("m1", "crash", "starting", 5.0),
        ]
    )
    assert state.machines["m1"].crashes == [4.0, 5.0]
    state.apply(Transition("m1", "fail", "failed", 6.0))
    state.apply(Transition("m1", "start", "starting", 7.0))
    assert state.machines["m1"].crashes == []


EVENTS = list(MachineEvent)


def legal_history(choices: list[int]) -> list[Record]:
    """A random walk over the transition table, as records."""
    records: list[Record] = [Boot(1, 0.0), Created("m1", SPEC, "k", 0.5)]
    state = MachineState.CREATED
    at = 1.0
    for choice in choices:
        event = EVENTS[choice % len(EVENTS)]
        try:
            next_state(state, event)
        except IllegalTransition:
            continue
        at += 1
        before, state = state, next_state(state, event)
        records.append(Transition("m1", event.value, state.value, at))
        if state is MachineState.STARTING and (before is not MachineState.SUSPENDED
                                               or choice % 2):  # a thaw launches nothing
            records.append(Launched("m1", int(at), int(at), 5000, at))
        if state is MachineState.DESTROYED:
            break
    return records


@settings(max_examples=200)
@given(st.lists(st.integers(min_value=0, max_value=50), max_size=60))
def test_a_snapshot_replays_to_the_same_state(choices: list[int]) -> None:
    state = replay(legal_history(choices))
    again = replay(snapshot(state))
    assert again.epoch == state.epoch
    assert again.offers == state.offers
    assert {k: (m.state, m.process, m.image_digest, m.fresh, thaws(m))
            for k, m in again.machines.items()} == {
        k: (m.state, m.process, m.image_digest, m.fresh, thaws(m))
        for k, m in state.machines.items()
    }


def test_an_offer_that_fits_is_accepted_under_the_new_id() -> None:
    decision = decide_offer(AgentState(), Capacity(2, 1024), "k", SPEC, "new", draining=False)
    assert decision == Accept("new", existing=False)


def test_an_offer_naming_an_id_another_offer_took_is_declined() -> None:
    """Placement chooses ids (a machine's route ticket is for its id): never two machines
    under one, whatever the offers say."""
    state = replay([Created("m1", SPEC, "k1", 1.0)])
    decision = decide_offer(state, Capacity(2, 1024), "k2", SPEC, "m1", draining=False)
    assert isinstance(decision, Decline) and decision.reason == "id_taken"


def running(mid: str, key: str) -> list[Record]:
    return [Created(mid, SPEC, key, 1.0), Transition(mid, "start", "starting", 2.0),
            Transition(mid, "ready", "started", 3.0)]


def test_an_offer_beyond_capacity_is_declined_with_no_capacity() -> None:
    state = replay(running("m1", "k1") + running("m2", "k2"))
    decision = decide_offer(state, Capacity(2, 4096), "k3", SPEC, "m3", draining=False)
    assert isinstance(decision, Decline) and decision.reason == "no_capacity"
    big = MachineSpec(app="a", image="i", guest=Guest(cpus=0.5, memory_mb=8192))
    decision = decide_offer(AgentState(), Capacity(4, 4096), "k4", big, "m4", draining=False)
    assert isinstance(decision, Decline) and "8192" in decision.message


def test_the_same_offer_key_names_the_same_machine_even_when_full() -> None:
    state = replay([Created("m1", SPEC, "k1", 1.0)])
    decision = decide_offer(state, Capacity(1, 256), "k1", SPEC, "other", draining=False)
    assert decision == Accept("m1", existing=True)


def test_a_draining_worker_declines_new_offers() -> None:
    decision = decide_offer(AgentState(), Capacity(8, 8192), "k", SPEC, "m", draining=True)
    assert isinstance(decision, Decline) and decision.reason == "draining"


def test_restart_backoff_doubles_and_is_capped() -> None:
    policy = RestartPolicy(base_delay_s=0.1, max_delay_s=0.3, max_crashes=10, window_s=60)
    assert after_crash(policy, [], 100.0) == Restart(0.1)
    assert after_crash(policy, [99.0], 100.0) == Restart(0.2)
    assert after_crash(policy, [98.0, 99.0], 100.0) == Restart(0.3)


def test_a_crash_loop_gives_up_and_old_crashes_are_forgotten() -> None:
    policy = RestartPolicy(max_crashes=3, window_s=10)
    assert isinstance(after_crash(policy, [95.0, 96.0, 97.0], 100.0), GiveUp)
    assert isinstance(after_crash(policy, [50.0, 60.0, 97.0], 100.0), Restart)


LAUNCHED = ("launched", "")  # the machine's process is recorded
GONE = ("gone", "")  # ... and its exit
STARTED = [("start", "starting"), LAUNCHED, ("ready", "started")]
SUSPENDED = [*STARTED, ("suspend", "suspending"), ("suspended", "suspended")]

# (what happened) -> (cpus, memory_mb) held, for SPEC = 1 cpu / 256 MB
HELD = [
    ([], (0.0, 0)),  # created: a spare holds nothing
    ([("start", "starting")], (1.0, 256)),
    (STARTED, (1.0, 256)),
    ([*STARTED, ("suspend", "suspending")], (1.0, 256)),
    (SUSPENDED, (0.0, 256)),  # frozen: memory kept, cpu given back
    ([*SUSPENDED, GONE], (0.0, 0)),  # the frozen process died: nothing left to hold
    ([*STARTED, ("stop", "stopping"), GONE, ("exited", "stopped")], (0.0, 0)),
    ([("start", "starting"), ("fail", "failed")], (0.0, 0)),
]


@pytest.mark.parametrize(("events", "expected"), HELD)
def test_a_machine_holds_capacity_only_while_it_runs(
    events: list[tuple[str, str]], expected: tuple[float, int]
) -> None:
    records: list[Record] = [Created("m1", SPEC, "k1", 1.0)]
    for event, state in events:
        if (event, state) == LAUNCHED:
            records.append(Launched("m1", 10, 1, 9000, 2.0))
        elif (event, state) == GONE:
            records.append(Gone("m1", 2.0))
        else:
            records.append(Transition("m1", event, state, 2.0))
    assert replay(records).reserved() == expected


def test_stopping_or_destroying_holds_while_the_process_lives_and_not_after() -> None:
    base = [*running("m1", "k1"), Launched("m1", 10, 1, 9000, 3.0)]
    stopping = replay([*base, Transition("m1", "stop", "stopping", 4.0)])
    assert stopping.reserved() == (1.0, 256)
    assert replay([*base, Transition("m1", "stop", "stopping", 4.0), Gone("m1", 5.0)]
                  ).reserved() == (0.0, 0)
    destroying = replay([*base, Transition("m1", "destroy", "destroying", 4.0)])
    assert destroying.reserved() == (1.0, 256)


def test_a_full_worker_takes_spares_but_declines_to_start_them() -> None:
    full = replay(running("m1", "k1"))
    spare = decide_offer(full, Capacity(1, 256), "k2", SPEC, "m2", draining=False,
                         needs_room=False)
    assert spare == Accept("m2", existing=False)
    started = decide_offer(full, Capacity(1, 256), "k3", SPEC, "m3", draining=False)
    assert isinstance(started, Decline) and started.reason == "no_capacity"
    state = replay([*running("m1", "k1"), Created("m2", SPEC, "k2", 1.0)])
    refused = decide_start(state, Capacity(1, 256), state.machines["m2"])
    assert refused is not None and refused.reason == "no_capacity"
    assert decide_start(state, Capacity(2, 512), state.machines["m2"]) is None


def test_resuming_a_suspended_machine_needs_only_its_cpus_again() -> None:
    state = replay([*running("m1", "k1"), Transition("m1", "suspend", "suspending", 4.0),
                    Transition("m1", "suspended", "suspended", 5.0)])
    # 256 MB are its own already: one more cpu is all a resume needs
    assert decide_start(state, Capacity(1, 256), state.machines["m1"]) is None


def test_an_offer_to_start_is_written_as_its_creation_and_its_start_together() -> None:
    state = replay(accepted_records("m1", SPEC, "k1", 1.0, start=True))
    assert state.machines["m1"].state is MachineState.STARTING
    assert state.offers == {"k1": "m1"}
    spare = replay(accepted_records("m2", SPEC, "k2", 1.0, start=False))
    assert spare.machines["m2"].state is MachineState.CREATED


def test_the_highest_fencing_token_per_app_is_kept_and_survives_a_snapshot() -> None:
    state = replay([Boot(epoch=1, at=0.0), Fenced("a", 200, 1.0), Fenced("a", 100, 2.0),
                    Fenced("b", 7, 3.0)])
    assert state.fences == {"a": 200, "b": 7}  # an older token written late lowers nothing
    assert replay(snapshot(state)).fences == {"a": 200, "b": 7}


def test_a_call_under_an_older_token_is_refused_and_one_without_is_not_fenced() -> None:
    state = replay([Fenced("a", 200, 1.0)])
    assert "older than 200" in stale_fence(state, "a", 199)
    assert stale_fence(state, "a", 200) == ""  # the holder's own, again
    assert stale_fence(state, "a", 201) == ""  # a newer holder
    assert stale_fence(state, "a", None) == ""  # a wake: no lease claimed
    assert stale_fence(state, "other", 1) == ""


def test_only_a_start_of_a_suspended_machine_thaws_it_unprobed() -> None:
    """A live process found by a start is ready without a probe only if a suspend froze
    it; one launched and not yet ready (the agent died during its probe) is probed."""
    frozen = [*running("m1", "k1"), Transition("m1", "suspend", "suspending", 4.0),
              Transition("m1", "suspended", "suspended", 5.0)]
    resumed = replay([*frozen, Transition("m1", "start", "starting", 6.0)])
    assert thaws(resumed.machines["m1"])
    assert thaws(replay(snapshot(resumed)).machines["m1"])  # compaction keeps the events
    assert not thaws(replay(frozen).machines["m1"])  # not being started
    launched = replay([Created("m2", SPEC, "k2", 1.0), Transition("m2", "start", "starting", 2.0),
                       Launched("m2", 42, 7, 8080, 2.5)])
    assert not thaws(launched.machines["m2"])
    restarted = replay([*running("m3", "k3"), Transition("m3", "crash", "starting", 4.0)])
    assert not thaws(restarted.machines["m3"])
    stopped = replay([*running("m4", "k4"), Transition("m4", "stop", "stopping", 4.0),
                      Transition("m4", "exited", "stopped", 5.0),
                      Transition("m4", "start", "starting", 6.0)])
    assert not thaws(stopped.machines["m4"])
    # the frozen process died and the start launched another (its agent then died during
    # that one's probe): the events still end suspended, start — the new one is probed
    relaunched = replay([*frozen, Transition("m1", "start", "starting", 6.0),
                         Gone("m1", 6.5, "killed"), Launched("m1", 43, 9, 8080, 6.6)])
    assert not thaws(relaunched.machines["m1"])
    ready = replay([*frozen, Transition("m1", "start", "starting", 6.0),
                    Transition("m1", "ready", "started", 6.1, RESUMED)])
    assert thawed(ready.machines["m1"])  # answered before its records are on disk
    booted = replay([*frozen, Transition("m1", "start", "starting", 6.0),
                     Gone("m1", 6.5, "killed"), Launched("m1", 43, 9, 8080, 6.6),
                     Transition("m1", "ready", "started", 7.0)])
    assert not thawed(booted.machines["m1"]) and not thawed(replay(frozen).machines["m1"])
    assert not thaws(replay(snapshot(relaunched)).machines["m1"])
