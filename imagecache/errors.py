"""The one error type of the image cache. `code` is stable and machine-readable."""

from __future__ import annotations

import errno

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
        "no_space",  # the cache budget or the disk (above its reserve) cannot hold it
        "io_error",  # a local file operation failed (EMFILE, EIO, EACCES, ...)
    }
)

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class ImageError(Exception):
    """A pull, verify or unpack failed: `code` is one of `CODES`, the message says what."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def os_failure(exc: OSError, what: str) -> ImageError:
    """The ImageError for a local OSError while doing `what`: no_space or io_error.

    The message carries the system's reason, never the path (it may be the
    cache's own layout, which is none of an image owner's business).
    """
    reason = exc.strerror or type(exc).__name__
    code = "no_space" if exc.errno in _NO_SPACE else "io_error"
    return ImageError(code, f"{what}: {reason}")
