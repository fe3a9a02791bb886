"""A pull that must be refused: the ImageError it raised, with the cache closed after."""

from __future__ import annotations

import pytest

from imagecache.cache import ImageCache
from imagecache.errors import ImageError


async def refused_pull(cache: ImageCache, ref: str) -> ImageError:
    try:
        with pytest.raises(ImageError) as caught:
            await cache.pull(ref)
    finally:
        await cache.close()
    return caught.value
