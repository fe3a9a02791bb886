"""Log lines never carry a credential, whoever wrote them (pure: a formatter and records)."""

from __future__ import annotations

import json
import logging
import sys

from ground.logs import JsonFormatter

TOKEN = "thaw_0123456789abcdef_" + "S" * 43
BOOT = "operator-chosen-admin-token-0123456789"


def formatted(message: str, exc: BaseException | None = None) -> str:
    record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, message, None,
                               (type(exc), exc, None) if exc else None)
    return JsonFormatter().format(record)


def test_an_authorization_header_quoted_by_a_library_is_redacted() -> None:
    line = formatted("Invalid header value char:\n\n    b'Authorization: Bearer "
                     f"{BOOT}\\x01'\n")
    assert BOOT not in line and "[redacted]" in line
    assert json.loads(line)["logger"] == "aiohttp.server"


def test_tokens_signatures_and_bearer_values_are_redacted_in_messages_and_tracebacks() -> None:
    try:
        raise ValueError(f"bad header x-thaw-signature: kid=abc,sig={'f' * 64} from {TOKEN}")
    except ValueError as exc:
        line = formatted(f"failed: bearer {BOOT} then {TOKEN}", sys.exc_info()[1] or exc)
    assert BOOT not in line and "S" * 43 not in line and "f" * 64 not in line
    assert "thaw_0123456789abcdef_[redacted]" in line  # the id stays: it names the token


def test_headers_in_a_python_repr_are_redacted() -> None:
    line = formatted("request headers: <CIMultiDictProxy('Host': 'a', 'Authorization': "
                     f"'Basic dXNlcjpwYXNzd29yZA==', 'X-Thaw-Signature': 'kid=ab,sig={'e' * 64}'"
                     f", 'authorization': 'Bearer {BOOT}'>")
    for secret in ("dXNlcjpwYXNzd29yZA==", "e" * 64, BOOT):
        assert secret not in line
    assert "'Host': 'a'" in json.loads(line)["msg"]


def test_an_ordinary_line_is_left_as_it_is() -> None:
    for text in ("denied GET /v1/apps/x from 127.0.0.1: token=0123456789abcdef revoked",
                 "a valid bearer token is required"):
        assert json.loads(formatted(text))["msg"] == text
