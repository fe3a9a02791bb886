"""Image references as the image cache speaks of them: the ground's parse
(ground/imageref.py, shared with app configs), its refusal as ImageError('bad_reference')."""

from __future__ import annotations

from ground import imageref
from ground.imageref import (
    DEFAULT_TAG,
    DOCKER_HUB,
    ImageRef,
    LayoutRef,
    RegistryRef,
    is_digest,
    is_loopback_host,
)
from imagecache.errors import ImageError

__all__ = ["DEFAULT_TAG", "DOCKER_HUB", "ImageRef", "LayoutRef", "RegistryRef", "is_digest",
           "is_loopback_host", "parse_reference"]


def parse_reference(text: str) -> ImageRef:
    """Parse an image reference; raise ImageError('bad_reference') naming what is wrong."""
    try:
        return imageref.parse_reference(text)
    except imageref.BadReference as exc:
        raise ImageError("bad_reference", exc.message) from None
