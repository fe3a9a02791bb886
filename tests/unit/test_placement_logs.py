"""The pure parts of `thaw logs`: the follow cursor and cutting chunks at whole lines."""

from __future__ import annotations

import pytest

from placement.core.logs import (
    MAX_CURSOR_MACHINES,
    BadCursor,
    format_cursor,
    lines,
    parse_cursor,
    whole_lines,
)


def test_a_cursor_round_trips_and_an_empty_one_means_every_log_from_its_tail() -> None:
    offsets = {"m-b": 0, "m_a": 12345}
    assert parse_cursor(format_cursor(offsets)) == offsets
    assert format_cursor(offsets) == "m-b:0,m_a:12345"
    assert parse_cursor("") == {}


@pytest.mark.parametrize("bad", ["m1", "m1:-3", "m1:x", "m 1:3", "a" * 65 + ":1", "m1:1," * 1000,
                                 "m:1234567890123456"])
def test_a_cursor_that_is_not_machine_offset_pairs_is_refused(bad: str) -> None:
    with pytest.raises(BadCursor):
        parse_cursor(bad)


def test_a_cursor_naming_too_many_machines_is_refused() -> None:
    with pytest.raises(BadCursor, match="more than"):
        parse_cursor(",".join(f"m{i}:1" for i in range(MAX_CURSOR_MACHINES + 1)))


def test_a_chunk_is_cut_after_its_last_newline_so_no_line_is_split() -> None:
    assert whole_lines(b"one\ntwo\nthr", full=False) == b"one\ntwo\n"
    assert whole_lines(b"one\n", full=False) == b"one\n"
    assert whole_lines(b"partial", full=False) == b""


def test_a_line_longer_than_a_whole_chunk_is_given_rather_than_stuck() -> None:
    assert whole_lines(b"x" * 10, full=True) == b"x" * 10


def test_lines_never_fail_on_bytes_that_are_not_utf8() -> None:
    assert lines(b"caf\xc3\xa9\n\xff\xfe ok\n") == ["café", "\ufffd\ufffd ok"]


def test_lines_end_at_newlines_only_so_a_machine_cannot_forge_a_stamped_line() -> None:
    from placement.core.logs import lines

    chunk = "2026-11-27T12:00:00.000Z benign\r1999-01-01T00:00:00.000Z spoofed\u2028x\n"
    assert lines(chunk.encode()) == [chunk[:-1]]
    assert lines(b"a\nb\n") == ["a", "b"] and lines(b"a\nb") == ["a", "b"]
