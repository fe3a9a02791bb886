"""What the image cache counts of its pulls, for metrics (read by the agent's /metrics)
and for the agent's heartbeat (the measured download rate placement predicts pulls by)."""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest download in the rate's EWMA: a few pulls move it, one odd blob
# (a slow registry moment) does not make it.
RATE_WEIGHT = 0.3
# Blobs smaller than this say more about round trips than about bandwidth: not rated.
MIN_RATED_BYTES = 256 * 1024


@dataclass
class PullStats:
    """Counts since the cache was opened; never reset (Prometheus counters)."""

    hits: int = 0  # the image was here whole: nothing downloaded or unpacked
    misses: int = 0  # blobs had to be downloaded or the image unpacked (or waited for)
    failures: int = 0  # pulls that ended in an ImageError
    layers_downloaded: int = 0  # blobs fetched from a registry or layout
    bytes_downloaded: int = 0  # their sizes
    bytes_per_s: float = 0.0  # EWMA of downloads' rates (0: none rated yet)

    def downloaded(self, size: int, seconds: float) -> None:
        """One blob of `size` bytes came in `seconds` (its write included): counted, and
        rated when it is big enough to say something about bandwidth."""
        self.layers_downloaded += 1
        self.bytes_downloaded += size
        if size >= MIN_RATED_BYTES and seconds > 0:
            self.bytes_per_s = ewma(self.bytes_per_s, size / seconds, RATE_WEIGHT)


def ewma(previous: float, sample: float, weight: float) -> float:
    """`sample` folded into `previous` with `weight` in (0, 1]; the first sample (previous
    0) is taken whole."""
    return sample if previous <= 0 else previous + weight * (sample - previous)
