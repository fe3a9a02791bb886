"""The edges' shared loads, the pure part: what an edge publishes of its own and how it
counts the others' at each machine (edge/loadshare.py; no event loop)."""

from __future__ import annotations

import asyncio

from edge.loadshare import IDLE_EVERY, MAX_REQUESTS, REST_MAX_S, LoadShare, MemoryLoadBoard, summed
from edge.view import View
from ground.appconfig import parse


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def shared(held: dict[str, int] | None = None) -> tuple[LoadShare, View, Clock]:
    clock = Clock()
    view = View("localhost", clock=clock)
    for app in ("web", "api"):
        view.set_app(app, parse({"name": app, "image": "img"}))
        for n in (1, 2):
            view.add_started(app, f"{app}-m{n}", f"127.0.0.1:{9000 + n}")
    holding = held or {}
    share = LoadShare(view, MemoryLoadBoard(), "e1", lambda app: holding.get(app, 0),
                      lambda: [a for a, n in holding.items() if n], lambda entry: None)
    return share, view, clock


def test_an_edge_publishes_its_own_requests_per_machine_and_its_demand_per_app() -> None:
    share, view, _ = shared(held={"api": 3})
    web = view.apps["web"]
    web.machines["web-m1"].in_flight = 2
    web.in_flight = 2
    loads, demand = share.collect()
    assert (loads, demand) == ({"web": {"web-m1": 2}}, {"web": 2, "api": 3})
    share.published(loads, demand)
    share.apply({"web": {"web-m1": 5, "web-m2": 1}})  # others' requests are not its own
    assert share.collect() == ({"web": {"web-m1": 2}}, {"web": 2, "api": 3})
    web.machines["web-m1"].in_flight -= 2  # its requests ended
    web.in_flight = 0
    assert share.collect() == ({}, {"web": 0, "api": 3})  # web's withdrawn
    assert share.collect() == ({}, {"web": 0, "api": 3})  # again, until it is published
    share.published({}, {"web": 0, "api": 3})
    assert share.collect() == ({}, {"api": 3})


def test_the_others_requests_count_at_each_machine_until_they_stop_sharing() -> None:
    share, view, clock = shared()
    m1, m2 = view.apps["web"].machines["web-m1"], view.apps["web"].machines["web-m2"]
    m1.in_flight = 1  # one of this edge's own
    clock.now = 130.0
    share.apply({"web": {"web-m1": 4}, "gone": {"x": 1}, "api": {"unknown": 2}})
    assert (m1.in_flight, m1.elsewhere, m2.in_flight) == (5, 4, 0)
    assert m1.last_start == 130.0  # busy elsewhere: not idle here
    share.apply({"web": {"web-m1": 2, "web-m2": 3}})
    assert (m1.in_flight, m1.elsewhere, m2.in_flight, m2.elsewhere) == (3, 2, 3, 3)
    share.apply({})  # every other edge gone quiet (or the board away)
    assert (m1.in_flight, m1.elsewhere, m2.in_flight, m2.elsewhere) == (1, 0, 0, 0)


def test_apps_whose_machines_carry_more_or_less_of_the_others_load_are_named() -> None:
    # less: room to release held requests into; more: held requests may need machines
    share, view, _ = shared()
    assert [e.name for e in share.apply({"web": {"web-m1": 4}})] == ["web"]  # more
    assert [e.name for e in share.apply({"web": {"web-m1": 4}})] == []  # the same
    assert [e.name for e in share.apply({"web": {"web-m1": 2}})] == ["web"]  # less
    # web's none now, api's more
    assert sorted(e.name for e in share.apply({"api": {"api-m1": 1}})) == ["api", "web"]
    assert view.apps["web"].machines["web-m1"].elsewhere == 0


def test_loads_from_several_edges_are_summed_per_machine() -> None:
    assert summed([{"web": {"m1": 1}}, {"web": {"m1": 2, "m2": 1}, "api": {"m9": 4}}]) == {
        "web": {"m1": 3, "m2": 1}, "api": {"m9": 4}}
    assert summed([]) == {}
    # another edge's negative or absurd figure neither cancels nor swamps the others'
    assert summed([{"web": {"m1": 3}}, {"web": {"m1": -5, "m2": 10**12}}]) == {
        "web": {"m1": 3, "m2": MAX_REQUESTS}}


def test_an_idle_edge_shares_once_in_idle_every_rounds_and_anything_of_its_own_at_once(
) -> None:
    share, view, _ = shared()
    idle = [share.due(*share.collect()) for _ in range(3 * IDLE_EVERY)]
    assert idle == ([False] * (IDLE_EVERY - 1) + [True]) * 3  # once per its entries' TTL
    assert not share.due(*share.collect())
    web = view.apps["web"]
    web.machines["web-m1"].in_flight = web.in_flight = 1  # a request of its own
    assert share.due(*share.collect())
    web.machines["web-m1"].in_flight = web.in_flight = 0
    share.published({}, {"web": 1})
    assert share.collect()[1] == {"web": 0} and share.due(*share.collect())  # withdrawn
    share.published({}, {"web": 0})
    share.apply({"web": {"web-m2": 3}})  # the others' load on its machines: every round
    assert all(share.due(*share.collect()) for _ in range(2 * IDLE_EVERY))
    share.apply({})
    assert not share.due(*share.collect())


def test_the_others_loads_are_fresh_for_an_interval_and_a_half_after_a_read() -> None:
    share, _, clock = shared()
    assert not share.fresh()  # never shared
    share.published({}, {})
    assert share.fresh()
    clock.now += share.interval_s * 1.5
    assert share.fresh()
    clock.now += share.interval_s * 0.1  # an idle edge's rounds skipped meanwhile
    assert not share.fresh()  # auto-stop asks for a round before it stops anything
    for _ in range(IDLE_EVERY - 2):  # an idle edge between its shares...
        assert not share.due(*share.collect())
    loop = asyncio.new_event_loop()  # (not run: a future to stand for a refresh's)
    share._waiting.append(loop.create_future())  # ...asked by refresh(): shares next
    assert share.due(*share.collect())
    share.published({}, {})  # the round answered it
    assert not share.due(*share.collect())
    loop.close()


def test_an_unused_edge_does_not_look_at_its_apps_but_a_withdrawal_still_goes_out() -> None:
    looked: list[int] = []
    share, view, _ = shared()
    unused = [True]
    share.unused = lambda: unused[0]
    collect = share.collect
    share.collect = lambda: looked.append(1) or collect()  # type: ignore[method-assign]
    assert share.own() == ({}, {}) and looked == []
    share.published({}, {"web": 2})  # a demand published before the edge went unused
    assert share.own() == ({}, {"web": 0}) and looked == [1]  # its withdrawal goes out
    share.published({}, {"web": 0})
    assert share.own() == ({}, {}) and looked == [1]
    unused[0] = False
    view.apps["web"].machines["web-m1"].in_flight = view.apps["web"].in_flight = 1
    assert share.own() == ({"web": {"web-m1": 1}}, {"web": 1}) and looked == [1, 1]


def test_a_share_is_news_when_it_names_a_machine_the_last_did_not() -> None:
    share, _, _ = shared()
    assert not share.news({})
    assert share.news({"web": {"web-m1": 1}})  # from none to some
    share.published({"web": {"web-m1": 1}}, {"web": 1})
    assert not share.news({"web": {"web-m1": 3}})  # more on the same machine: not news
    assert share.news({"web": {"web-m1": 1, "web-m2": 1}})  # another machine
    assert share.news({"web": {"web-m1": 1}, "api": {"api-m1": 1}})  # another app
    share.published({}, {"web": 0})  # its requests ended
    assert share.news({"web": {"web-m1": 1}})  # they begin again: news again


def test_only_a_quiet_unused_edge_that_read_the_news_throughout_the_round_rests() -> None:
    share, _, _ = shared()
    unused = [True]
    share.unused = lambda: unused[0]
    share.listening = 3  # the third read of the news since the start
    assert share.rest(listened=0) is None  # not read when the round began
    assert share.rest(listened=2) is None  # read broke off (and began again) meanwhile
    assert share.rest(listened=3) == REST_MAX_S
    assert share.due({}, {})  # the round after a rest always shares
    assert not share.due({}, {})
    unused[0] = False  # a client
    assert share.rest(listened=3) is None
    unused[0] = True
    share.apply({"web": {"web-m2": 1}})  # the others' load on its machines
    assert share.rest(listened=3) is None
    share.apply({})
    share.published({}, {"api": 2})  # a demand to withdraw first
    assert share.rest(listened=3) is None
    share.published({}, {"api": 0})
    assert share.rest(listened=3) == REST_MAX_S
    share.listening = 0  # the news cannot be read: rounds again
    assert share.rest(listened=3) is None


def test_machines_past_their_hard_limit_with_every_edges_requests_are_named_held_or_not(
) -> None:
    # Each edge admitted its own within hard_limit (25) on a stale count of the other's:
    # once shared, web-m1 carries 20 + 10. Nothing is held here, yet the cold path is
    # told (its requests past the limit call for a wake, edge/core/appwake.py); api's
    # machine, busier elsewhere but within the limit, is not.
    told: list[str] = []
    board = MemoryLoadBoard()
    view = View("localhost", clock=Clock())
    for app in ("web", "api"):
        view.set_app(app, parse({"name": app, "image": "img"}))
        view.add_started(app, f"{app}-m1", "127.0.0.1:9001")
    share = LoadShare(view, board, "e1", lambda app: 0, lambda: [],
                      lambda entry: told.append(entry.name))
    view.apps["web"].machines["web-m1"].in_flight = 20
    view.apps["web"].in_flight = 20

    async def rounds() -> None:
        await board.share("e2", {"web": {"web-m1": 10}, "api": {"api-m1": 24}}, {}, 10.0)
        await share.once()

    asyncio.run(rounds())
    assert told == ["web"]
