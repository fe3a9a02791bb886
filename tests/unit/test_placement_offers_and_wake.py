"""The offer loop over injected answers, and the wake / autostop / deploy plans."""

from __future__ import annotations

from ground.appconfig import AppConfig, Concurrency
from placement.core.market import Decision, Scored
from placement.core.offers import (
    Answer,
    NoCapacity,
    OfferTo,
    Placed,
    Reply,
    next_offer,
    offer_key,
)
from placement.core.wake import (
    MachineState,
    Refuse,
    Stop,
    decide_autostop,
    deploy_shortfall,
    machines_for,
    plan_wake,
    room_for_new,
    wake_failure,
)


def decision(*workers: str) -> Decision:
    ranked = tuple(Scored(w, f"http://{w}", 1.0 - i / 10, {}) for i, w in enumerate(workers))
    return Decision("hello", "local", ranked, (), len(workers), len(workers))


def drive(d: Decision, replies: list[Reply]) -> tuple[list[str], OfferTo | Placed | NoCapacity]:
    """Run the loop, answering each offer with the next injected reply."""
    answers: list[Answer] = []
    offered: list[str] = []
    pending = list(replies)
    while True:
        step = next_offer(d, answers, "p1")
        if not isinstance(step, OfferTo):
            return offered, step
        offered.append(step.worker)
        reply = pending.pop(0)
        answers.append(Answer(step.worker, reply, machine_id="m1" if reply is Reply.ACCEPTED
                              else ""))


def test_the_first_offer_goes_to_the_best_worker_with_a_stable_idempotency_key() -> None:
    step = next_offer(decision("w1", "w2"), [], "p1")
    assert step == OfferTo("w1", "http://w1", offer_key("p1", "w1"))
    assert next_offer(decision("w1", "w2"), [], "p1") == step  # a retry carries the same key


def test_a_decline_sends_the_offer_to_the_next_worker() -> None:
    offered, result = drive(decision("w1", "w2", "w3"), [Reply.NO_CAPACITY, Reply.ACCEPTED])
    assert offered == ["w1", "w2"]
    assert result == Placed("w2", "m1")


def test_three_declines_end_in_no_capacity_even_with_more_workers_left() -> None:
    replies = [Reply.NO_CAPACITY, Reply.DRAINING, Reply.UNREACHABLE, Reply.ACCEPTED]
    offered, result = drive(decision("w1", "w2", "w3", "w4"), replies)
    assert offered == ["w1", "w2", "w3"]
    assert isinstance(result, NoCapacity)
    assert "w1: no_capacity" in result.reason and "w2: draining" in result.reason


def test_a_stale_fence_ends_the_placement_at_once() -> None:
    step = next_offer(decision("w1", "w2", "w3"),
                      [Answer("w1", Reply.STALE_FENCE, message="409 older token")], "p1")
    assert isinstance(step, NoCapacity) and "w1: stale_fence" in step.reason


def test_an_empty_ranking_is_no_capacity_without_any_offer() -> None:
    offered, result = drive(decision(), [])
    assert offered == [] and isinstance(result, NoCapacity)


def config(**fields: object) -> AppConfig:
    values: dict[str, object] = {"name": "hello", "image": "hello:v1", "max_machines": 3}
    values.update(fields)
    return AppConfig(**values)  # type: ignore[arg-type]


def test_a_wake_reuses_suspended_then_stopped_machines_before_placing_new_ones() -> None:
    machines = [MachineState("m-stop", "w1", "stopped"), MachineState("m-susp", "w2", "suspended")]
    plan = plan_wake(config(max_machines=5), machines, {"w1", "w2"}, count=3)
    assert [m.id for m in plan.reuse] == ["m-susp", "m-stop"]
    assert plan.new == 1 and plan.shortfall == ""


def test_a_wake_never_exceeds_max_machines() -> None:
    machines = [MachineState("m1", "w1", "started")]
    plan = plan_wake(config(max_machines=2), machines, {"w1"}, count=10)
    assert plan.reuse == () and plan.new == 1
    assert "max_machines=2" in plan.shortfall


def test_stopped_machines_count_against_max_machines_when_new_ones_are_needed() -> None:
    machines = [MachineState("m1", "w1", "started"), MachineState("m2", "w1", "stopped")]
    plan = plan_wake(config(max_machines=2), machines, {"w1"}, count=2)
    assert [m.id for m in plan.reuse] == ["m2"] and plan.new == 0


def test_machines_on_dead_workers_are_neither_reused_nor_counted() -> None:
    machines = [MachineState("m1", "w-dead", "stopped")]
    plan = plan_wake(config(max_machines=1), machines, {"w1"}, count=1)
    assert plan.reuse == () and plan.new == 1


def test_a_machine_claimed_by_another_wake_is_not_reused_twice() -> None:
    machines = [MachineState("m1", "w1", "stopped")]
    plan = plan_wake(config(), machines, {"w1"}, count=1, claimed={"m1"})
    assert plan.reuse == () and plan.new == 1


def test_autostop_refuses_to_go_below_min_machines_running() -> None:
    machines = [MachineState("m1", "w1", "started"), MachineState("m2", "w1", "started")]
    refused = decide_autostop(config(min_machines_running=2), machines, "m1")
    assert isinstance(refused, Refuse) and refused.code == "min_machines_running"
    assert decide_autostop(config(min_machines_running=1), machines, "m1") == Stop(False)


def test_autostop_suspends_when_the_app_says_suspend_and_refuses_when_off() -> None:
    machines = [MachineState("m1", "w1", "started")]
    assert decide_autostop(config(auto_stop="suspend"), machines, "m1") == Stop(True)
    off = decide_autostop(config(auto_stop="off"), machines, "m1")
    assert isinstance(off, Refuse) and off.code == "auto_stop_off"


def test_deploy_adds_the_missing_running_machines_and_spares_within_max_machines() -> None:
    assert deploy_shortfall(config(min_machines_running=1, spares=1), []) == (1, 1)
    running = [MachineState("m1", "w1", "started")]
    assert deploy_shortfall(config(min_machines_running=1, spares=1), running) == (0, 1)
    assert deploy_shortfall(config(min_machines_running=2, spares=2, max_machines=3), []) == (2, 1)


def test_a_wake_with_nothing_ready_reports_deadline_then_start_failed_then_no_capacity() -> None:
    assert wake_failure(["start_failed"], pending=1) == "deadline"
    assert wake_failure(["no_capacity", "start_failed"], pending=0) == "start_failed"
    assert wake_failure(["no_capacity"], pending=0) == "no_capacity"


def test_new_machines_another_wake_is_placing_count_against_max_machines() -> None:
    plan = plan_wake(config(max_machines=2), [], {"w1"}, count=2, placing=1)
    assert plan.new == 1 and "max_machines=2" in plan.shortfall


def test_a_failed_machine_is_reused_last_rather_than_holding_its_slot_forever() -> None:
    machines = [MachineState("m-failed", "w1", "failed"), MachineState("m-stop", "w1", "stopped")]
    plan = plan_wake(config(max_machines=2), machines, {"w1"}, count=2)
    assert [m.id for m in plan.reuse] == ["m-stop", "m-failed"] and plan.new == 0


def test_max_machines_counts_machines_in_every_region_but_reuses_only_in_the_one_woken() -> None:
    machines = [MachineState("fra-1", "w-fra", "started"),
                MachineState("fra-2", "w-fra", "stopped")]
    plan = plan_wake(config(max_machines=2, regions=["mad", "fra"]), machines,
                     {"w-fra", "w-mad"}, count=2, region_workers={"w-mad"})
    assert plan.reuse == () and plan.new == 0  # 2 exist already, in fra
    assert "max_machines=2" in plan.shortfall


def test_a_machine_still_starting_is_waited_for_rather_than_another_one_started() -> None:
    machines = [MachineState("m-boot", "w1", "starting")]
    plan = plan_wake(config(max_machines=1), machines, {"w1"}, count=1)
    assert [m.id for m in plan.reuse] == ["m-boot"] and plan.new == 0
    assert plan.shortfall == ""
    claimed = plan_wake(config(max_machines=1), machines, {"w1"}, count=1, claimed={"m-boot"})
    assert claimed.reuse == () and claimed.new == 0  # another wake waits for it already


def test_room_for_new_counts_machines_in_every_state_but_gone_ones_and_those_placing() -> None:
    machines = [MachineState("m-stop", "w1", "stopped"), MachineState("m-up", "w2", "started"),
                MachineState("m-gone", "w1", "destroying"),
                MachineState("m-dead", "w-dead", "stopped")]
    assert room_for_new(config(max_machines=4), machines, {"w1", "w2"}) == 2
    assert room_for_new(config(max_machines=4), machines, {"w1", "w2"}, placing=1) == 1
    assert room_for_new(config(max_machines=1), machines, {"w1", "w2"}, placing=1) == 0


def test_a_stopped_machine_alone_at_max_machines_leaves_no_room_for_a_replacement() -> None:
    stopped = [MachineState("m-stop", "w1", "stopped")]
    assert room_for_new(config(max_machines=1), stopped, {"w1", "w2"}) == 0
    assert room_for_new(config(max_machines=2), stopped, {"w1", "w2"}) == 1


def test_a_wake_sized_by_demand_brings_the_machines_up_or_coming_up_to_what_it_needs() -> None:
    app = config(max_machines=12, concurrency=Concurrency(soft_limit=25, hard_limit=30))
    # Edge A woke for 100 requests: 4 being placed. Edge B's wake now says 100 more.
    plan = plan_wake(app, [], {"w1"}, count=1, placing=4, demand=200)
    assert plan.reuse == () and plan.new == 4 and plan.shortfall == ""
    # Started, claimed (not yet seen) and placed machines all count; a starting one nobody
    # claimed is this wake's to wait for, as part of what it starts.
    machines = [MachineState("up", "w1", "started"), MachineState("boot", "w1", "starting"),
                MachineState("susp", "w1", "suspended")]
    plan = plan_wake(app, machines, {"w1"}, count=1, claimed={"elsewhere"}, placing=1,
                     demand=200)
    assert [m.id for m in plan.reuse] == ["boot", "susp"] and plan.new == 3


def test_a_wake_whose_demand_the_machines_coming_up_cover_starts_nothing() -> None:
    app = config(max_machines=12, concurrency=Concurrency(soft_limit=25, hard_limit=30))
    plan = plan_wake(app, [MachineState("m1", "w1", "stopped")], {"w1"}, count=5, placing=4,
                     demand=100)
    assert plan.reuse == () and plan.new == 0 and plan.shortfall == ""


def test_demand_past_max_machines_is_capped_and_says_so() -> None:
    app = config(max_machines=3, concurrency=Concurrency(soft_limit=10, hard_limit=10))
    assert machines_for(app, 1_000) == 3 and machines_for(app, 0) == 0
    assert machines_for(app, 11) == 2
    plan = plan_wake(app, [MachineState("m1", "w1", "started")], {"w1"}, count=1, demand=1_000)
    assert plan.new == 2 and plan.shortfall == ""


def test_a_machine_made_before_its_wake_claims_it_is_counted_once_and_not_reused() -> None:
    """Another wake is placing 3 machines; an agent has made and reported 2 of them before
    that wake's claim names them: 3 are coming, not 5, and none of the 2 is started twice."""
    app = config(max_machines=12, concurrency=Concurrency(soft_limit=25, hard_limit=30))
    machines = [MachineState("up", "w1", "started"), MachineState("new1", "w1", "created"),
                MachineState("new2", "w2", "created")]
    plan = plan_wake(app, machines, {"w1", "w2"}, count=1, placing=3, demand=200)
    assert plan.reuse == () and plan.new == 4  # 8 - (1 started + 3 coming)
    assert room_for_new(app, machines, {"w1", "w2"}, placing=1) == 8
