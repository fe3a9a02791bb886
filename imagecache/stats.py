"""What the image cache counts of its pulls, for metrics (read by the agent's /metrics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PullStats:
    """Counts since the cache was opened; never reset (Prometheus counters)."""

    hits: int = 0  # the image was here whole: nothing downloaded or unpacked
    misses: int = 0  # blobs had to be downloaded or the image unpacked (or waited for)
    failures: int = 0  # pulls that ended in an ImageError
    layers_downloaded: int = 0  # blobs fetched from a registry or layout
    bytes_downloaded: int = 0  # their sizes
