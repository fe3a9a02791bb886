"""Room and time for what a pull writes: how much the cache may take, and by when.

Pure: from the byte budget, what the cache holds and has reserved, and the
disk's free bytes above its reserve, decide the total that present blobs and
rootfs must shrink to before `need_bytes` more may be written, and say why it
cannot when eviction would not get there. A blob's deadline is a fixed
allowance plus its declared size at a floor rate. Invariant: a write that was
given room keeps the cache within the budget and the disk above its reserve,
as long as nothing outside the cache fills the disk (the shell checks that
while streaming). It must not know about files, clocks or the network.
"""

from __future__ import annotations

from dataclasses import dataclass

# The HTTP connection pool (adapters/egress.checked_session): connections in
# all, and per registry host. Downloads are bounded the same way, so a pull
# never holds more blob files open than it can have sockets.
POOL_CONNECTIONS = 256
POOL_PER_HOST = 8


@dataclass(frozen=True)
class DownloadLimits:
    """How blobs are fetched: disk reserve, deadline, concurrency. Validated when built."""

    disk_reserve_bytes: int = 512 * 2**20  # free disk a pull never takes the cache root below
    min_bytes_per_s: float = 256 * 1024  # a blob's deadline: its size at this floor rate ...
    allowance_s: float = 60.0  # ... plus this fixed allowance (connect, token, redirects)
    max_downloads: int = POOL_CONNECTIONS  # blob downloads at once, over all pulls
    max_downloads_per_pull: int = POOL_PER_HOST  # blob downloads at once in one pull

    def __post_init__(self) -> None:
        if self.disk_reserve_bytes < 0:
            raise ValueError("disk_reserve_bytes must be >= 0")
        if not self.min_bytes_per_s > 0 or not self.allowance_s > 0:
            raise ValueError("min_bytes_per_s and allowance_s must be > 0")
        if self.max_downloads < 1 or self.max_downloads_per_pull < 1:
            raise ValueError("max_downloads and max_downloads_per_pull must be >= 1")


def pull_blocked(free_bytes: int, evictable_bytes: int, reserve_bytes: int) -> str:
    """Why no pull can write a byte now ("" when one can): the disk's free bytes, were
    every evictable blob and rootfs gone, would still be at or below the reserve that a
    pull never takes the disk under (every write stops there). All in bytes."""
    if free_bytes + evictable_bytes > reserve_bytes:
        return ""
    return (f"free disk {_mib(free_bytes)} ({_mib(evictable_bytes)} more evictable) is below "
            f"the image cache's reserve of {_mib(reserve_bytes)}")


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


def blob_deadline_s(size: int, limits: DownloadLimits) -> float:
    """Seconds a whole blob of `size` bytes may take, however steadily it trickles."""
    return limits.allowance_s + size / limits.min_bytes_per_s


@dataclass(frozen=True)
class Room:
    """The cache's standing when something is about to be written. All in bytes.

    `held`: blobs and charged rootfs on disk; `reserved`: promised to writes
    in flight; `disk_room`: free disk above the reserve (may be negative).
    """

    budget: int
    held: int
    reserved: int
    disk_room: int

    def shrink_target(self, need: int) -> int:
        """The total `held` must shrink to for `need` more bytes (evicting frees disk too)."""
        return min(self.budget, self.held + self.disk_room) - self.reserved - need

    def largest_fit(self, floor: int) -> int:
        """The most that fits once `held` has shrunk to `floor` (all it can evict gone)."""
        return self.shrink_target(0) - floor

    def refusal(self, need: int, floor: int) -> str:
        """Why `need` more bytes cannot fit when `held` can shrink only to `floor`."""
        if floor + self.reserved + need > self.budget:
            pinned = floor + self.reserved
            return (
                f"{need} bytes do not fit the cache budget of {self.budget} bytes "
                f"({pinned} held by pinned images and pulls in flight)"
            )
        free = max(self.held + self.disk_room - floor - self.reserved, 0)
        return f"{need} bytes do not fit the {free} bytes free on disk above its reserve"
