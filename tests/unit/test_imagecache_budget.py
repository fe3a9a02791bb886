"""Room for a write (budget, reservations, disk reserve), deadlines, local errors: pure."""

from __future__ import annotations

import errno

import pytest

from imagecache.core.budget import DownloadLimits, Room, blob_deadline_s, pull_blocked
from imagecache.errors import os_failure


def test_a_blob_deadline_is_the_allowance_plus_its_size_at_the_floor_rate() -> None:
    limits = DownloadLimits(min_bytes_per_s=1000, allowance_s=5.0)
    assert blob_deadline_s(0, limits) == 5.0
    assert blob_deadline_s(20_000, limits) == 25.0


@pytest.mark.parametrize(
    "bad",
    [
        {"disk_reserve_bytes": -1},
        {"min_bytes_per_s": 0},
        {"allowance_s": 0},
        {"max_downloads": 0},
        {"max_downloads_per_pull": 0},
    ],
)
def test_download_limits_refuse_values_that_would_stop_every_pull(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DownloadLimits(**bad)  # type: ignore[arg-type]


def test_the_budget_binds_when_the_disk_has_room() -> None:
    room = Room(budget=1000, held=600, reserved=100, disk_room=10_000)
    assert room.shrink_target(200) == 700  # already there: nothing to evict
    assert room.shrink_target(500) == 400  # evict 200
    assert room.largest_fit(floor=100) == 800


def test_the_disk_binds_when_it_has_less_room_than_the_budget() -> None:
    room = Room(budget=10_000, held=600, reserved=0, disk_room=300)
    assert room.shrink_target(500) == 400  # evicting 200 frees 200 on disk too
    assert "free on disk above its reserve" in room.refusal(2000, floor=0)


def test_refusal_names_the_budget_and_what_pinned_images_and_pulls_hold() -> None:
    room = Room(budget=1000, held=900, reserved=50, disk_room=10_000)
    assert room.refusal(500, floor=700) == (
        "500 bytes do not fit the cache budget of 1000 bytes "
        "(750 held by pinned images and pulls in flight)"
    )


@pytest.mark.parametrize(
    ("code", "expected"),
    [(errno.ENOSPC, "no_space"), (errno.EDQUOT, "no_space"), (errno.EMFILE, "io_error"),
     (errno.EIO, "io_error")],
)
def test_local_os_errors_become_image_errors_without_the_path(code: int, expected: str) -> None:
    error = os_failure(OSError(code, "reason", "/var/lib/thaw/secret/path"), "writing blob x")
    assert (error.code, error.message) == (expected, "writing blob x: reason")


def test_a_disk_below_the_reserve_blocks_pulls_unless_evicting_would_lift_it_above() -> None:
    mib = 2**20
    assert pull_blocked(600 * mib, 0, 512 * mib) == ""
    assert pull_blocked(300 * mib, 0, 512 * mib) == (
        "free disk 300 MiB (0 MiB more evictable) is below the image cache's reserve of "
        "512 MiB")
    assert pull_blocked(300 * mib, 300 * mib, 512 * mib) == ""  # eviction makes room
    assert pull_blocked(512 * mib, 0, 512 * mib) != ""  # not one byte may be written
