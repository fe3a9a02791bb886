"""The one error type of the image cache. `code` is stable and machine-readable."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from contextlib import contextmanager

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
log = logging.getLogger("thaw.imagecache")


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


@contextmanager
def only_image_errors(what: str) -> Iterator[None]:
    """Let nothing but an ImageError out of the block doing `what`.

    An OSError no adapter translated becomes `os_failure`; anything else
    unforeseen (a bug, or a limit of the host such as RecursionError) becomes
    `io_error` naming only its type, and is logged with its traceback.
    """
    try:
        yield
    except ImageError:
        raise
    except OSError as exc:
        raise os_failure(exc, what) from None
    except Exception as exc:
        log.error("%s failed unexpectedly", what, exc_info=exc)
        raise ImageError("io_error", f"{what}: {type(exc).__name__}") from None
