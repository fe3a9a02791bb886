"""The image cache counts its pulls: a first pull of an image is a miss that downloads its
layers, a second one a hit that downloads nothing, a refused one a failure. Its rate is
the whole pull's: the bytes downloaded over the time from the call to the unpacked image."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.errors import ImageError
from imagecache.stats import MIN_RATED_BYTES
from thaw.imagebuild import build_image

pytestmark = pytest.mark.integration

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


async def test_pulls_are_counted_as_hits_misses_and_failures(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    build_image(HELLO, "hello:v1", layout=layout)
    cache = ImageCache(tmp_path / "cache", budget_bytes=1 << 30,
                       policy=EgressPolicy.build(layout_dirs=[str(tmp_path)]))
    try:
        image = await cache.pull(f"oci:{layout}:v1")
        stats = cache.stats
        assert (stats.hits, stats.misses, stats.failures) == (0, 1, 0)
        assert stats.layers_downloaded == len(image.layers)
        assert stats.bytes_downloaded == sum(layer.size for layer in image.layers)
        await cache.pull(f"oci:{layout}:v1")
        assert (stats.hits, stats.misses, stats.layers_downloaded) == (1, 1, len(image.layers))
        with pytest.raises(ImageError):
            await cache.pull(f"oci:{tmp_path / 'nowhere'}:v1")
        assert stats.failures == 1
    finally:
        await cache.close()


async def test_a_pull_is_rated_over_its_whole_time_and_a_hit_leaves_the_rate(
        tmp_path: Path) -> None:
    src = tmp_path / "padded"
    shutil.copytree(HELLO, src)
    (src / "padding.bin").write_bytes(os.urandom(4 * MIN_RATED_BYTES))  # (gzip keeps it)
    layout = tmp_path / "layout"
    build_image(src, "padded:v1", layout=layout)
    cache = ImageCache(tmp_path / "cache", budget_bytes=1 << 30,
                       policy=EgressPolicy.build(layout_dirs=[str(tmp_path)]))
    try:
        began = time.monotonic()
        await cache.pull(f"oci:{layout}:v1")
        whole_s = time.monotonic() - began
        stats = cache.stats
        by_call = stats.bytes_downloaded / whole_s
        # the pull's own time is within the call's: not its downloads' alone (which left
        # out resolving, the config, digest checks and unpacking would rate far higher)
        assert by_call <= stats.bytes_per_s <= by_call * 1.1
        rate = stats.bytes_per_s
        await cache.pull(f"oci:{layout}:v1")  # a hit: nothing downloaded, nothing rated
        assert stats.bytes_per_s == rate
    finally:
        await cache.close()
