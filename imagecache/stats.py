"""What the image cache counts of its pulls, for metrics (read by the agent's /metrics)
and for the agent's heartbeat (the measured pull rate placement predicts pulls by)."""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest pull in the rate's EWMA: a few pulls move it, one odd pull (a slow
# registry moment) does not make it.
RATE_WEIGHT = 0.3
# Pulls that downloaded less than this say more about round trips than about bandwidth:
# not rated.
MIN_RATED_BYTES = 256 * 1024


@dataclass
class PullStats:
    """Counts since the cache was opened; never reset (Prometheus counters)."""

    hits: int = 0  # the image was here whole: nothing downloaded or unpacked
    misses: int = 0  # blobs had to be downloaded or the image unpacked (or waited for)
    failures: int = 0  # pulls that ended in an ImageError
    layers_downloaded: int = 0  # blobs fetched from a registry or layout
    bytes_downloaded: int = 0  # their sizes
    # EWMA of whole pulls' rates (0: none rated yet): the bytes a pull downloaded over
    # the pull's whole time, resolve to unpacked, which is what a wake waits for.
    bytes_per_s: float = 0.0

    def downloaded(self, size: int) -> None:
        """One blob of `size` bytes came in: counted."""
        self.layers_downloaded += 1
        self.bytes_downloaded += size

    def pulled(self, downloaded_bytes: int, seconds: float) -> None:
        """A pull ended well after `seconds` in all (resolve, config, downloads, digest
        checks, unpack), having downloaded `downloaded_bytes` itself: rated when that is
        enough to say something about bandwidth. A pull that found its blobs here, or
        waited for another pull's downloads, downloaded little or nothing: not rated."""
        if downloaded_bytes >= MIN_RATED_BYTES and seconds > 0:
            self.bytes_per_s = ewma(self.bytes_per_s, downloaded_bytes / seconds, RATE_WEIGHT)


@dataclass
class PullBytes:
    """The bytes one pull downloaded itself (blobs fetched while it waited on another
    pull's download are that pull's)."""

    downloaded: int = 0


def ewma(previous: float, sample: float, weight: float) -> float:
    """`sample` folded into `previous` with `weight` in (0, 1]; the first sample (previous
    0) is taken whole."""
    return sample if previous <= 0 else previous + weight * (sample - previous)
