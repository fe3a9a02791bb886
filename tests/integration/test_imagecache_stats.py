"""The image cache counts its pulls: a first pull of an image is a miss that downloads its
layers, a second one a hit that downloads nothing, a refused one a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.errors import ImageError
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
