"""When a reader of a lost registry may prune again (ground/registry/generation.py)."""

from __future__ import annotations

from ground.registry.generation import view_whole


def test_the_view_is_whole_once_the_current_generation_is_marked_republished() -> None:
    assert not view_whole("", "g2", lost_at=100.0, now=101.0, bound_s=60)
    assert not view_whole("g1", "g2", lost_at=100.0, now=101.0, bound_s=60)  # the old one
    assert view_whole("g2", "g2", lost_at=100.0, now=101.0, bound_s=60)


def test_without_a_marker_the_view_is_taken_as_whole_only_after_the_bound() -> None:
    assert not view_whole("", "g2", lost_at=100.0, now=159.9, bound_s=60)
    assert view_whole("", "g2", lost_at=100.0, now=160.0, bound_s=60)
