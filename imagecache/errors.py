"""The one error type of the image cache. `code` is stable and machine-readable."""

from __future__ import annotations

CODES = frozenset(
    {
        "bad_reference",
        "not_found",
        "digest_mismatch",
        "size_mismatch",
        "unsafe_layer",
        "unauthorized",
        "forbidden_host",
        "registry_error",
        "unsupported",
    }
)


class ImageError(Exception):
    """A pull, verify or unpack failed: `code` is one of `CODES`, the message says what."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
