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
    """...and each client's count is what it has held, whichever way its items left."""
    queues: HoldQueues[Item] = HoldQueues(max_total=1000, max_per_client=4)
    # FIFO of (item, deadline, client) per app
    model: dict[str, list[tuple[Item, float, bytes]]] = {"a": [], "b": []}
    now = 0.0
    counter = 0
    for op, app, arg in ops:
        now += 0.5
        if op == "enqueue":
            counter += 1
            item = Item(counter)
            client = b"x" if arg % 2 else b"y"
            had = sum(1 for fifo in model.values() for *_, c in fifo if c == client)
            decision = queues.enqueue(app, item, now, 1.0 + arg, max_pending=10, client=client)
            if isinstance(decision, Held):
                model[app].append((item, now + 1.0 + arg, client))
            assert (decision == Rejected("too_many_held")) == (had >= 4)
        elif op == "release":
            released = queues.release(app, arg)
            assert released == [item for item, *_ in model[app][:arg]]
            del model[app][:arg]
        elif op == "remove" and model[app]:
            victim, *_ = model[app].pop(arg % len(model[app]))
            assert queues.remove(app, victim)
        elif op == "expire":
            expired = {(e.app, e.item.n) for e in queues.expire(now)}
            due = {(name, item.n) for name, fifo in model.items() for item, d, _ in fifo
                   if d <= now}
            assert expired == due
            for name in model:
                model[name] = [entry for entry in model[name] if entry[1] > now]
        assert queues.total == sum(len(fifo) for fifo in model.values())
        deadlines = [d for fifo in model.values() for _, d, _ in fifo]
        assert queues.next_deadline() == (min(deadlines) if deadlines else None)
        counts: dict[bytes, int] = {}
        for fifo in model.values():
            for *_, client in fifo:
                counts[client] = counts.get(client, 0) + 1
        assert queues.by_client == counts


def test_a_client_at_its_bound_gets_too_many_held_and_others_are_still_held() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=100, max_per_client=2)
    assert isinstance(queues.enqueue("a", "1", 0.0, 30.0, 10, client=b"10.0.0.1"), Held)
    assert isinstance(queues.enqueue("b", "2", 0.0, 30.0, 10, client=b"10.0.0.1"), Held)
    # over all apps: a third, to any app, is refused for this client alone
    assert queues.enqueue("c", "3", 0.0, 30.0, 10, client=b"10.0.0.1") == Rejected(
        "too_many_held")
    assert isinstance(queues.enqueue("a", "4", 0.0, 30.0, 10, client=b"10.0.0.2"), Held)
    assert isinstance(queues.enqueue("a", "5", 0.0, 30.0, 10), Held)  # no client: no bound
    assert queues.release("a", 1) == ["1"]  # one of its own left: room for one more
    assert isinstance(queues.enqueue("c", "3", 0.0, 30.0, 10, client=b"10.0.0.1"), Held)
    with pytest.raises(ValueError):
        HoldQueues(max_total=100, max_per_client=0)


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


def test_one_app_holds_at_most_its_share_and_leaves_the_rest_to_others() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=100, max_share=0.1)
    results = [queues.enqueue("flood", f"f{i}", 0.0, 30.0, max_pending=1000) for i in range(50)]
    assert sum(isinstance(r, Held) for r in results) == 10
    assert set(results[10:]) == {Rejected("queue_full")}  # its own overflow, for it alone
    assert isinstance(queues.enqueue("calm", "c", 0.0, 30.0, max_pending=1000), Held)


def test_it_takes_apps_at_their_share_to_fill_the_edge() -> None:
    queues: HoldQueues[str] = HoldQueues(max_total=20, max_share=0.5)
    for app in ("a", "b"):
        for i in range(10):
            assert isinstance(queues.enqueue(app, f"{app}{i}", 0.0, 30.0, 1000), Held)
    assert queues.enqueue("c", "c0", 0.0, 30.0, 1000) == Rejected("edge_full")


def test_a_share_outside_0_to_1_is_refused() -> None:
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="max_share"):
            HoldQueues(max_total=10, max_share=share)
