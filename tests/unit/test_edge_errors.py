"""The edge's own answers: a status, a code and a fixed message per code, never the detail."""

from __future__ import annotations

import json

import pytest

from edge.errors import MESSAGES, RETRY_AFTER, STATUS, error_response


def body_of(answer: bytes) -> dict[str, str]:
    return json.loads(answer.partition(b"\r\n\r\n")[2])  # type: ignore[no-any-return]


def test_every_edge_error_code_has_a_fixed_message() -> None:
    assert set(MESSAGES) == set(STATUS)


@pytest.mark.parametrize("code", sorted(STATUS))
def test_an_answer_says_the_code_and_its_message_and_nothing_of_the_detail(code: str) -> None:
    detail = "agent http://10.1.2.3:7001/internal-thing: machine m1 (10.1.2.3:9000) reset"
    answer = error_response(code, detail, keep_alive=True)
    assert answer.startswith(b"HTTP/1.1 %d " % STATUS[code])
    assert body_of(answer) == {"error": code, "message": MESSAGES[code]}
    assert b"10.1.2.3" not in answer and b"internal-thing" not in answer
    assert (b"Retry-After: 1\r\n" in answer) == (code in RETRY_AFTER)


def test_a_code_the_edge_does_not_know_is_a_500_with_a_generic_message() -> None:
    answer = error_response("made_up_code", "registry 10.9.9.9 said no", keep_alive=False)
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert body_of(answer) == {"error": "made_up_code", "message": "internal error"}


@pytest.mark.parametrize(
    ("code", "status"),
    [("bad_host", 400), ("bad_target", 400), ("transfer_coding_not_supported", 501)],
)
def test_a_bad_host_or_target_is_400_and_a_coding_besides_chunked_501(code: str,
                                                                      status: int) -> None:
    assert error_response(code, "", keep_alive=False).startswith(b"HTTP/1.1 %d " % status)
