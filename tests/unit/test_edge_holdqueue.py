"""HoldQueues: FIFO per app, bounded per app and in total, deadlines as values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.core.holdqueue import Held, HoldQueues, Rejected, request_timeout_s


def test_held_requests_are_released_oldest_first_up_to_the_capacity_given() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=100)
    for item in "abcde":
        assert isinstance(queues.enqueue("app", item, 0.0, 30.0, 10), Held)
    assert queues.release("app", 2) == ["a", "b"]
    assert queues.release("app", 10) == ["c", "d", "e"]
    assert queues.total == 0 and queues.held("app") == 0


def test_a_full_app_queue_rejects_with_queue_full_and_keeps_the_others() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=100)
    queues.enqueue("app", "a", 0.0, 30.0, max_pending=1)
    assert queues.enqueue("app", "b", 0.0, 30.0, max_pending=1) == Rejected("queue_full")
    assert isinstance(queues.enqueue("other", "c", 0.0, 30.0, max_pending=1), Held)
    assert queues.held("app") == 1


def test_the_total_bound_rejects_with_edge_full_across_apps() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=2)
    queues.enqueue("a", "1", 0.0, 30.0, 10)
    queues.enqueue("b", "2", 0.0, 30.0, 10)
    assert queues.enqueue("c", "3", 0.0, 30.0, 10) == Rejected("edge_full")


def test_max_pending_zero_holds_nothing() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=2)
    assert queues.enqueue("a", "1", 0.0, 30.0, 0) == Rejected("queue_full")


def test_the_deadline_is_the_shorter_of_hold_timeout_and_the_clients_timeout() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=10)
    assert queues.enqueue("app", "slow", 100.0, 30.0, 10) == Held(1, 130.0)
    assert queues.enqueue("app", "hurried", 100.0, 30.0, 10, client_timeout_s=2.0) == Held(2, 102.0)
    assert queues.enqueue("app", "lazy", 100.0, 30.0, 10, client_timeout_s=90.0) == Held(3, 130.0)
    assert queues.next_deadline() == 102.0


def test_expire_returns_only_items_past_their_deadline_with_their_wait() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=10)
    queues.enqueue("app", "a", 0.0, 1.0, 10)
    queues.enqueue("app", "b", 0.5, 1.0, 10)
    queues.enqueue("app", "c", 0.0, 5.0, 10)
    expired = queues.expire(1.2)
    assert [(e.app, e.item, round(e.waited_s, 3)) for e in expired] == [("app", "a", 1.2)]
    assert [e.item for e in queues.expire(1.5)] == ["b"]
    assert queues.release("app", 5) == ["c"]
    assert queues.expire(100.0) == []


def test_a_removed_item_is_never_released_or_expired() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=10)
    queues.enqueue("app", "a", 0.0, 1.0, 10)
    queues.enqueue("app", "b", 0.0, 1.0, 10)
    assert queues.remove("app", "a") is True
    assert queues.remove("app", "a") is False
    assert queues.total == 1
    assert [e.item for e in queues.expire(5.0)] == ["b"]


def test_fail_all_empties_one_app_in_fifo_order() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=10)
    for item in "xyz":
        queues.enqueue("app", item, 0.0, 1.0, 10)
    queues.enqueue("other", "o", 0.0, 1.0, 10)
    assert queues.fail_all("app") == ["x", "y", "z"]
    assert queues.apps() == ["other"] and queues.total == 1


class Item:
    """A held request stand-in: identity matters, as for the edge's exchanges."""

    def __init__(self, n: int) -> None:
        self.n = n


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["enqueue", "release", "remove", "expire"]),
                          st.sampled_from(["a", "b"]), st.integers(0, 5)), max_size=80))
def test_the_deadline_heap_expires_exactly_what_a_full_scan_would(
    ops: list[tuple[str, str, int]],
) -> None:
    queues: HoldQueues[Item] = HoldQueues(max_total=1000)
    model: dict[str, list[tuple[Item, float]]] = {"a": [], "b": []}  # FIFO of (item, deadline)
    now = 0.0
    counter = 0
    for op, app, arg in ops:
        now += 0.5
        if op == "enqueue":
            counter += 1
            item = Item(counter)
            decision = queues.enqueue(app, item, now, 1.0 + arg, max_pending=10)
            if isinstance(decision, Held):
                model[app].append((item, now + 1.0 + arg))
        elif op == "release":
            released = queues.release(app, arg)
            assert released == [item for item, _ in model[app][:arg]]
            del model[app][:arg]
        elif op == "remove" and model[app]:
            victim, _ = model[app].pop(arg % len(model[app]))
            assert queues.remove(app, victim)
        elif op == "expire":
            expired = {(e.app, e.item.n) for e in queues.expire(now)}
            due = {(name, item.n) for name, fifo in model.items() for item, d in fifo if d <= now}
            assert expired == due
            for name in model:
                model[name] = [(item, d) for item, d in model[name] if d > now]
        assert queues.total == sum(len(fifo) for fifo in model.values())
        deadlines = [d for fifo in model.values() for _, d in fifo]
        assert queues.next_deadline() == (min(deadlines) if deadlines else None)


def test_late_takes_out_only_the_items_whose_deadline_comes_before_a_predicted_start() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=10)
    queues.enqueue("a", "soon", 0.0, 30.0, 10, client_timeout_s=1.0)
    queues.enqueue("a", "later", 0.0, 30.0, 10, client_timeout_s=5.0)
    queues.enqueue("a", "exact", 0.0, 30.0, 10, client_timeout_s=4.0)
    queues.enqueue("b", "other", 0.0, 30.0, 10, client_timeout_s=1.0)
    late = queues.late("a", ready_at=4.0, now=0.5)
    assert [(e.item, e.waited_s) for e in late] == [("soon", 0.5)]  # "exact" is in time
    assert queues.held("a") == 2 and queues.held("b") == 1 and queues.total == 3
    assert queues.next_deadline("a") == 4.0


@pytest.mark.parametrize(("lines", "seconds"), [
    (b"X-Request-Timeout: 5\r\n", 5.0),
    (b"Accept: */*\r\nx-request-timeout:0.25\r\n", 0.25),
    (b"X-Request-Timeout: 3600\r\n", 3600.0),
    (b"", None), (b"X-Request-Timeout: 0\r\n", None), (b"X-Request-Timeout: -1\r\n", None),
    (b"X-Request-Timeout: nan\r\n", None), (b"X-Request-Timeout: 1e3\r\n", None),
    (b"X-Request-Timeout: 3601\r\n", None), (b"X-Request-Timeout: 5s\r\n", None),
    (b"Old-X-Request-Timeout: 5\r\n", None),
])
def test_the_clients_request_timeout_is_read_bounded_and_ignored_when_invalid(
    lines: bytes, seconds: float | None,
) -> None:
    assert request_timeout_s(lines) == seconds
