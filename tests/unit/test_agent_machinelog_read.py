"""Reading a machine's log from an offset: what `thaw logs -f` follows through placement."""

from __future__ import annotations

from pathlib import Path

from agent.machinelog import read_log, read_log_from, trim_log


def test_a_follower_reads_each_byte_once_and_picks_up_the_kept_tail_after_a_trim(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"one\ntwo\n")
    start, size, data = read_log_from(log, -1, 1024)  # no offset: the tail
    assert (start, size, data) == (0, 8, b"one\ntwo\n")
    with open(log, "ab") as f:
        f.write(b"three\n")
    assert read_log_from(log, start + len(data), 1024) == (8, 14, b"three\n")
    assert read_log_from(log, 14, 1024) == (14, 14, b"")  # nothing new
    with open(log, "ab") as f:
        f.write(b"x" * 100)
    assert trim_log(log, 50, 20)
    start, size, data = read_log_from(log, 114, 1024)  # past the end now: from the tail
    assert (start, size, data) == (0, 20, b"x" * 20)


def test_reads_are_bounded_and_a_missing_log_is_empty(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"abcdef")
    assert read_log_from(log, 1, 2) == (1, 6, b"bc")
    assert read_log_from(log, -1, -5) == (6, 6, b"")
    assert read_log_from(tmp_path / "none", 0, 10) == (0, 0, b"")
    assert read_log(log, 3) == b"def"
