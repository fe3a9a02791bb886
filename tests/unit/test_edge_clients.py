"""ClientTable: what one client may take of the edge, across its connections."""

from __future__ import annotations

import pytest

from edge.core.clients import FULL, MAX_BAR_S, SCAN, ClientTable


def test_a_client_has_at_most_max_conns_open_and_a_closed_one_frees_its_place() -> None:
    table = ClientTable(max_conns=3, conns_per_s=1000, resets_per_s=10)
    assert [table.open(b"a", 0.0) for _ in range(3)] == [None] * 3
    assert "more than 3 open connections" in (table.open(b"a", 0.0) or "")
    assert table.open(b"b", 0.0) is None  # another client: untouched
    table.close(b"a")
    assert table.open(b"a", 0.0) is None
    assert table.refused == {"barred": 0, "clients": 0, "connections": 1, "new_connections": 0}


def test_new_connections_per_second_are_a_bucket_of_twice_the_rate() -> None:
    table = ClientTable(max_conns=1000, conns_per_s=5, resets_per_s=10)
    answers = [table.open(b"a", 0.0) for _ in range(12)]
    assert answers[:10] == [None] * 10 and all(answers[10:])
    assert table.open(b"a", 0.1) is not None  # half a token back: not yet
    assert table.open(b"a", 0.2) is None  # one back
    assert table.open(b"a", 0.2) is not None
    assert table.open(b"a", 1.0) is None  # refilled at 5 per second


def test_a_burst_of_new_connections_past_its_bound_is_spread_at_the_rate() -> None:
    table = ClientTable(max_conns=1000, conns_per_s=500, resets_per_s=10, conns_burst=4)
    answers = [table.open(b"a", 0.0) for _ in range(6)]
    assert answers[:4] == [None] * 4 and all(answers[4:])  # 4 at once, not 1,000
    assert table.open(b"a", 0.002) is None  # then one every 2 ms
    assert table.open(b"a", 0.002) is not None
    assert table.open(b"a", 10.0) is None and table.open(b"a", 10.0) is None
    assert [table.open(b"a", 10.0) for _ in range(3)].count(None) == 2  # refilled to 4


def test_a_handed_over_connection_takes_no_new_connection_token() -> None:
    table = ClientTable(max_conns=10, conns_per_s=0.5, resets_per_s=10)
    assert table.open(b"a", 0.0) is None
    table.close(b"a")  # HTTP/1 hands the socket to HTTP/2
    assert table.open(b"a", 0.0, new=False) is None
    assert table.open_connections(b"a") == 1


def test_resets_are_budgeted_per_client_across_its_connections() -> None:
    table = ClientTable(max_conns=10, conns_per_s=100, resets_per_s=50)
    assert all(table.reset(b"a", 0.0) for _ in range(100))
    assert not table.reset(b"a", 0.0)
    assert table.reset(b"b", 0.0)  # another client's budget is its own
    assert table.reset(b"a", 0.1)  # 5 back after 0.1 s


def test_a_strike_bars_new_connections_doubling_up_to_the_cap() -> None:
    table = ClientTable(max_conns=10, conns_per_s=1000, resets_per_s=10)
    bars = [table.strike(b"a", float(i)) for i in range(10)]
    assert bars[:4] == [1.0, 2.0, 4.0, 8.0] and bars[-1] == MAX_BAR_S
    assert "barred" in (table.open(b"a", 9.5) or "")
    assert table.open(b"b", 9.5) is None
    assert table.open(b"a", 9.0 + MAX_BAR_S + 0.1) is None  # the bar ends


def test_strikes_are_forgiven_after_a_quiet_while() -> None:
    table = ClientTable(max_conns=10, conns_per_s=1000, resets_per_s=10)
    assert table.strike(b"a", 0.0) == 1.0 and table.strike(b"a", 5.0) == 2.0
    assert table.strike(b"a", 1000.0) == 1.0


def test_the_table_is_bounded_and_forgets_idle_clients_first() -> None:
    table = ClientTable(max_conns=10, conns_per_s=1000, resets_per_s=10, max_clients=3)
    assert table.open(b"busy", 0.0) is None
    table.strike(b"barred", 0.0)
    table.reset(b"idle", 0.0)
    table.reset(b"new", 0.0)  # over the bound: "idle" goes, the others hold something
    assert len(table) == 3 and table.open_connections(b"busy") == 1
    assert "barred" in (table.open(b"barred", 0.5) or "")


def test_a_full_table_of_clients_holding_something_refuses_a_new_one_and_forgets_none(
) -> None:
    """Forgetting a client with open connections would start its counts again from
    nothing (its next connections past its bound, its closes counted against a new
    entry): a new client is refused instead, until one holds nothing."""
    table = ClientTable(max_conns=2, conns_per_s=1000, resets_per_s=10, max_clients=2)
    assert table.open(b"a", 0.0) is None and table.open(b"a", 0.0) is None
    table.strike(b"b", 0.0)  # barred for 1 s
    assert table.open(b"c", 0.5) == FULL and table.arrive(b"c", 0.5) == FULL
    assert table.refused["clients"] == 2 and len(table) == 2
    assert "more than 2 open" in (table.open(b"a", 0.5) or "")  # a's count is whole
    assert table.open(b"c", 1.5) is None  # b's bar ended: b is forgotten, c has room
    table.close(b"a")
    assert table.open_connections(b"a") == 1


def test_the_look_for_a_client_to_forget_is_bounded() -> None:
    table = ClientTable(max_conns=10, conns_per_s=1000, resets_per_s=10,
                        max_clients=SCAN + 1)
    for i in range(SCAN):
        assert table.open(b"busy%d" % i, 0.0) is None  # the SCAN least recently seen
    table.reset(b"idle", 0.0)  # seen last: beyond the look
    assert table.open(b"new", 0.0) == FULL
    table.close(b"busy0")
    assert table.open(b"new", 0.0) is None and table.open_connections(b"idle") == 0


@pytest.mark.parametrize("bad", [{"max_conns": 0}, {"conns_per_s": 0}, {"resets_per_s": -1}])
def test_limits_must_be_positive(bad: dict[str, float]) -> None:
    limits: dict[str, float] = {"max_conns": 1, "conns_per_s": 1, "resets_per_s": 1, **bad}
    with pytest.raises(ValueError):
        ClientTable(int(limits["max_conns"]), limits["conns_per_s"], limits["resets_per_s"])


def test_a_tls_arrival_spends_a_new_connection_and_is_counted_open_after() -> None:
    table = ClientTable(max_conns=10, conns_per_s=1, resets_per_s=10)
    assert table.arrive(b"a", 0.0) is None and table.arrive(b"a", 0.0) is None
    assert "new connections" in (table.arrive(b"a", 0.0) or "")  # a burst of 2
    assert table.open_connections(b"a") == 0  # not yet serving
    assert table.open(b"a", 0.0, new=False) is None  # its handshake done: no new token
    assert table.open_connections(b"a") == 1
    table.strike(b"a", 0.0)
    assert "barred" in (table.arrive(b"a", 0.5) or "")


def test_a_client_begins_at_most_per_turn_requests_a_turn_over_all_its_connections() -> None:
    table = ClientTable(max_conns=100, conns_per_s=1000, resets_per_s=10, per_turn=4)
    for _ in range(3):
        assert table.open(b"a", 0.0) is None
    assert table.open(b"b", 0.0) is None
    a, b = table.state(b"a"), table.state(b"b")
    assert a is not None and b is not None and a.open == 3
    assert table.turn_left(a, 1) == 4
    assert [table.take_turn(a, 1) for _ in range(5)] == [True] * 4 + [False]
    assert table.turn_left(a, 1) == 0
    assert table.take_turn(b, 1)  # another client's share is its own
    assert table.turn_left(a, 2) == 4  # a new turn, a new share
    assert not table.take_turn(a, 2, 5)  # more than a share at once: none counted
    assert table.take_turn(a, 2, 3) and table.turn_left(a, 2) == 1
    assert table.deferred == 2
    assert table.state(b"unknown") is None
    with pytest.raises(ValueError):
        ClientTable(max_conns=1, conns_per_s=1, resets_per_s=1, per_turn=0)
