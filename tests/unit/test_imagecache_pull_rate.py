"""The pull rate an agent's heartbeat carries (imagecache/stats.py): whole pulls, bytes a
pull downloaded over the pull's whole time, as a wake waits for it; the download
counters are counted apart, for metrics."""

from __future__ import annotations

import pytest

from imagecache.stats import MIN_RATED_BYTES, PullStats

MB = 1_000_000


def test_downloads_are_counted_but_rate_nothing_by_themselves() -> None:
    stats = PullStats()
    stats.downloaded(10 * MB)
    stats.downloaded(100)
    assert (stats.layers_downloaded, stats.bytes_downloaded) == (2, 10 * MB + 100)
    assert stats.bytes_per_s == 0.0


def test_a_pull_is_rated_by_its_bytes_over_its_whole_time_as_an_ewma() -> None:
    stats = PullStats()
    stats.pulled(10 * MB, 2.0)  # the downloads took less; the wake waited 2 s
    assert stats.bytes_per_s == pytest.approx(5 * MB)
    stats.pulled(30 * MB, 2.0)
    assert stats.bytes_per_s == pytest.approx(8 * MB)  # 5 + 0.3 * (15 - 5)


def test_a_pull_that_downloaded_too_little_itself_is_not_rated() -> None:
    stats = PullStats()
    stats.pulled(0, 0.5)  # a hit, or another pull downloaded what it waited for
    stats.pulled(MIN_RATED_BYTES - 1, 0.001)  # round trips more than bandwidth
    stats.pulled(10 * MB, 0.0)
    assert stats.bytes_per_s == 0.0
    stats.pulled(MIN_RATED_BYTES, MIN_RATED_BYTES / (4 * MB))
    assert stats.bytes_per_s == pytest.approx(4 * MB)
