"""The order in which an edge asks its placements (edge/core/placementorder.py)."""

from __future__ import annotations

from edge.core.placementorder import DOWN_FOR_S, answered, parse_urls, trusted_urls, try_order
from ground.auth.tickets import RouteKeys, advert_seal
from ground.registry.types import PlacementAdvert

A, B, C = "http://a:1", "http://b:1", "http://c:1"


def test_the_given_order_when_nothing_is_known() -> None:
    assert try_order([A, B, C], "", {}, 100.0) == [A, B, C]


def test_the_placement_that_answered_last_comes_first() -> None:
    assert try_order([A, B, C], B, {}, 100.0) == [B, A, C]


def test_a_placement_that_failed_recently_goes_last_and_is_still_tried() -> None:
    assert try_order([A, B, C], "", {A: 99.0}, 100.0) == [B, C, A]
    # the one that answered last, failed since: last too
    assert try_order([A, B, C], A, {A: 99.0}, 100.0) == [B, C, A]


def test_failed_ones_least_recently_failed_first() -> None:
    assert try_order([A, B, C], "", {A: 99.5, B: 99.0}, 100.0) == [C, B, A]


def test_a_failure_older_than_the_down_time_is_forgotten() -> None:
    assert try_order([A, B], "", {A: 100.0 - DOWN_FOR_S - 0.1}, 100.0) == [A, B]


def test_every_url_once() -> None:
    assert try_order([A, B, A], "", {}, 0.0) == [A, B]
    assert try_order([], "", {}, 0.0) == []


def test_an_answer_clears_the_failure_and_becomes_last_ok() -> None:
    failed = {A: 99.0, B: 98.0}
    last = answered(failed, A)
    assert last == A and failed == {B: 98.0}
    assert try_order([A, B], last, failed, 100.0) == [A, B]


def test_parse_urls_repeatable_and_comma_separated() -> None:
    assert parse_urls("http://a:1/, http://b:1") == ("http://a:1", "http://b:1")
    assert parse_urls(["http://a:1", "http://b:1,http://a:1", ""]) == (
        "http://a:1", "http://b:1")
    assert parse_urls("") == ()


KEYS = RouteKeys.parse("a" * 32)
OTHER = RouteKeys.parse("b" * 32)


def advert(pid: str, url: str, keys: RouteKeys = KEYS) -> PlacementAdvert:
    return PlacementAdvert(pid, url, advert_seal(keys, pid, url))


def test_only_adverts_sealed_with_the_route_key_are_trusted() -> None:
    good = advert("p1", "http://a:1/")
    moved = PlacementAdvert("p1", "http://evil:1", good.seal)  # a seal copied elsewhere
    assert trusted_urls([good, advert("p2", "http://evil:2", OTHER), moved,
                         PlacementAdvert("p3", "http://evil:3")], KEYS) == ["http://a:1"]


def test_an_old_key_of_the_ring_still_verifies() -> None:
    ring = RouteKeys(OTHER.keys + KEYS.keys)  # rotated: OTHER makes seals, KEYS verifies
    assert trusted_urls([advert("p1", "http://a:1")], ring) == ["http://a:1"]


def test_without_a_route_key_nothing_is_discovered_and_only_http_urls_are() -> None:
    assert trusted_urls([advert("p1", "http://a:1")], None) == []
    assert trusted_urls([advert("p1", "file:///etc/passwd")], KEYS) == []
