"""The byte-budget LRU core: pure, no event loop."""

from __future__ import annotations

from imagecache.core.lru import LayerUse, choose_evictions


def _layers(**uses: tuple[int, int]) -> dict[str, LayerUse]:
    return {name: LayerUse(size=size, last_used=tick) for name, (size, tick) in uses.items()}


def test_least_recently_used_layer_is_evicted_first() -> None:
    layers = _layers(a=(100, 3), b=(100, 1), c=(100, 2))
    assert choose_evictions(layers, set(), budget_bytes=200) == ["b"]


def test_eviction_stops_as_soon_as_total_is_within_budget() -> None:
    layers = _layers(a=(100, 1), b=(100, 2), c=(100, 3), d=(100, 4))
    assert choose_evictions(layers, set(), budget_bytes=250) == ["a", "b"]


def test_nothing_is_evicted_when_already_within_budget() -> None:
    assert choose_evictions(_layers(a=(100, 1)), set(), budget_bytes=100) == []


def test_pinned_layers_are_never_evicted_even_if_budget_stays_exceeded() -> None:
    layers = _layers(a=(500, 1), b=(100, 2))
    assert choose_evictions(layers, {"a"}, budget_bytes=100) == ["b"]


def test_pinned_oldest_layer_is_skipped_and_next_oldest_goes() -> None:
    layers = _layers(a=(100, 1), b=(100, 2), c=(100, 3))
    assert choose_evictions(layers, {"a"}, budget_bytes=200) == ["b"]


def test_ties_on_last_use_break_by_digest_deterministically() -> None:
    layers = _layers(z=(100, 1), y=(100, 1), x=(100, 5))
    assert choose_evictions(layers, set(), budget_bytes=150) == ["y", "z"]


def test_zero_budget_evicts_every_unpinned_layer() -> None:
    layers = _layers(a=(1, 1), b=(2, 2), c=(3, 3))
    assert choose_evictions(layers, {"c"}, budget_bytes=0) == ["a", "b"]
