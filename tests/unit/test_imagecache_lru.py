"""The byte-budget LRU core over images (rootfs) and layers (blobs): pure, no event loop."""

from __future__ import annotations

from imagecache.core.lru import Evictions, ImageUse, LayerUse, choose_evictions


def _layers(**uses: tuple[int, int]) -> dict[str, LayerUse]:
    return {name: LayerUse(size=size, last_used=tick) for name, (size, tick) in uses.items()}


def _evict(
    layers: dict[str, LayerUse],
    target: int,
    images: dict[str, ImageUse] | None = None,
    *,
    pinned_layers: frozenset[str] = frozenset(),
    pinned_images: frozenset[str] = frozenset(),
) -> Evictions:
    return choose_evictions(
        layers,
        images or {},
        protected_layers=pinned_layers,
        protected_images=pinned_images,
        target_bytes=target,
    )


def _image(layers: str, rootfs_bytes: int, tick: int) -> ImageUse:
    return ImageUse(frozenset(layers), rootfs_bytes, tick)


def test_least_recently_used_layer_is_evicted_first() -> None:
    layers = _layers(a=(100, 3), b=(100, 1), c=(100, 2))
    assert _evict(layers, 200).layers == ["b"]


def test_eviction_stops_as_soon_as_total_is_within_budget() -> None:
    layers = _layers(a=(100, 1), b=(100, 2), c=(100, 3), d=(100, 4))
    choice = _evict(layers, 250)
    assert (choice.layers, choice.total_bytes) == (["a", "b"], 200)


def test_nothing_is_evicted_when_already_within_budget() -> None:
    assert _evict(_layers(a=(100, 1)), 100) == Evictions([], [], 100)


def test_pinned_layers_are_never_evicted_even_if_budget_stays_exceeded() -> None:
    layers = _layers(a=(500, 1), b=(100, 2))
    choice = _evict(layers, 100, pinned_layers=frozenset("a"))
    assert (choice.layers, choice.total_bytes) == (["b"], 500)


def test_pinned_oldest_layer_is_skipped_and_next_oldest_goes() -> None:
    layers = _layers(a=(100, 1), b=(100, 2), c=(100, 3))
    assert _evict(layers, 200, pinned_layers=frozenset("a")).layers == ["b"]


def test_ties_on_last_use_break_by_digest_deterministically() -> None:
    layers = _layers(z=(100, 1), y=(100, 1), x=(100, 5))
    assert _evict(layers, 150).layers == ["y", "z"]


def test_zero_budget_evicts_every_unpinned_layer() -> None:
    layers = _layers(a=(1, 1), b=(2, 2), c=(3, 3))
    assert _evict(layers, 0, pinned_layers=frozenset("c")).layers == ["a", "b"]


def test_unpacked_rootfs_bytes_count_toward_the_total() -> None:
    layers = _layers(a=(100, 2))
    images = {"i": _image("a", 900, 1)}
    choice = _evict(layers, 500, images)
    assert (choice.images, choice.layers, choice.total_bytes) == (["i"], [], 100)


def test_an_older_rootfs_goes_before_the_blobs_it_was_built_from() -> None:
    layers = _layers(a=(100, 2), b=(100, 3))
    images = {"i": _image("ab", 300, 1)}
    assert _evict(layers, 250, images) == Evictions(["i"], [], 200)


def test_evicting_a_layer_evicts_every_image_built_on_it() -> None:
    layers = _layers(a=(100, 1), b=(100, 5))
    images = {"i": _image("a", 50, 3), "j": _image("ab", 60, 4)}
    choice = _evict(layers, 150, images)
    assert (choice.layers, choice.images, choice.total_bytes) == (["a"], ["i", "j"], 100)


def test_a_pinned_image_keeps_its_layers_and_its_rootfs() -> None:
    layers = _layers(a=(100, 1), b=(100, 2))
    images = {"i": _image("a", 500, 0), "j": _image("b", 500, 3)}
    choice = _evict(layers, 0, images, pinned_images=frozenset({"i"}))
    assert (choice.images, choice.layers, choice.total_bytes) == (["j"], ["b"], 600)


def test_an_unpinned_image_on_the_layers_of_a_pinned_one_can_still_lose_its_rootfs() -> None:
    layers = _layers(a=(100, 1))
    images = {"pinned": _image("a", 500, 2), "twin": _image("a", 500, 3)}
    choice = _evict(layers, 700, images, pinned_images=frozenset({"pinned"}))
    assert (choice.images, choice.layers, choice.total_bytes) == (["twin"], [], 600)
