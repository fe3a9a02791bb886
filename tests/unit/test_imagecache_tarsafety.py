"""Lexical judgement of layer members: pure, no disk."""

from __future__ import annotations

import pytest

from imagecache.core.tarsafety import (
    Action,
    Member,
    MemberKind,
    UnpackLimits,
    UnpackTally,
    judge,
    normalise,
)

LIMITS = UnpackLimits(max_bytes=1000, max_members=10)


def _judge(member: Member, extracted: frozenset[str] = frozenset(), **used: int) -> Action:
    verdict = judge(
        member,
        extracted=extracted,
        used_bytes=used.get("used_bytes", 0),
        used_members=used.get("used_members", 0),
        limits=LIMITS,
    )
    return verdict.action


@pytest.mark.parametrize(
    ("name", "expected"),
    [("./a/b", "a/b"), ("a//b/.", "a/b"), ("./", ""), ("/etc/x", None), ("a/../../x", None)],
)
def test_names_are_normalised_or_refused_when_absolute_or_climbing(
    name: str, expected: str | None
) -> None:
    assert normalise(name) == expected


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a/../../x", "ok/\x00"])
def test_escaping_names_are_refused(name: str) -> None:
    assert _judge(Member(name, MemberKind.FILE)) is Action.REFUSE


def test_symlink_targets_are_left_to_the_rootfs_check_not_judged_lexically() -> None:
    # `a/evil -> ../../etc` climbs out however the rootfs looks, and `l -> s/../..`
    # may stay inside when `s` is a link to a deep directory: only the finished
    # rootfs can say (core.rootlinks), so judge extracts both.
    assert _judge(Member("a/evil", MemberKind.SYMLINK, linkname="../../etc")) is Action.EXTRACT
    assert _judge(Member("l", MemberKind.SYMLINK, linkname="s/../..")) is Action.EXTRACT


@pytest.mark.parametrize("target", ["", "a\x00b", "x" * 4096])
def test_empty_nul_bearing_or_over_long_symlink_targets_are_refused(target: str) -> None:
    assert _judge(Member("l", MemberKind.SYMLINK, linkname=target)) is Action.REFUSE


@pytest.mark.parametrize("name", ["a/" * 2048 + "f", "d/" + "n" * 256])
def test_names_over_path_max_or_with_a_component_over_name_max_are_refused(name: str) -> None:
    assert _judge(Member(name, MemberKind.FILE)) is Action.REFUSE


def test_hardlink_must_point_at_an_already_extracted_path_inside_the_root() -> None:
    link = Member("b", MemberKind.HARDLINK, linkname="a")
    assert _judge(link, frozenset({"a"})) is Action.EXTRACT
    assert _judge(link) is Action.REFUSE
    assert _judge(Member("b", MemberKind.HARDLINK, linkname="/etc/passwd")) is Action.REFUSE
    assert _judge(Member("b", MemberKind.HARDLINK, linkname="../x")) is Action.REFUSE


@pytest.mark.parametrize(
    "kind", [MemberKind.CHAR_DEVICE, MemberKind.BLOCK_DEVICE, MemberKind.FIFO, MemberKind.OTHER]
)
def test_devices_fifos_and_unknown_types_are_refused(kind: MemberKind) -> None:
    assert _judge(Member("dev/x", kind)) is Action.REFUSE


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o6755])
def test_setuid_and_setgid_members_are_refused(mode: int) -> None:
    assert _judge(Member("bin/x", MemberKind.FILE, mode=mode)) is Action.REFUSE


@pytest.mark.parametrize(("uid", "gid"), [(65536, 0), (0, 65536), (100000, 100000), (-1, 0)])
def test_owners_a_machines_user_namespace_cannot_hold_are_refused(uid: int, gid: int) -> None:
    assert _judge(Member("srv/x", MemberKind.FILE, uid=uid, gid=gid)) is Action.REFUSE


def test_owners_within_a_machines_ids_are_allowed() -> None:
    assert _judge(Member("home/app", MemberKind.DIR, uid=1000, gid=1000)) is Action.EXTRACT
    assert _judge(Member("x", MemberKind.FILE, uid=65535, gid=65534)) is Action.EXTRACT


def test_sticky_directory_is_allowed() -> None:
    assert _judge(Member("tmp", MemberKind.DIR, mode=0o1777)) is Action.EXTRACT


def test_member_count_and_byte_limits_refuse_the_member_that_crosses_them() -> None:
    assert _judge(Member("f", MemberKind.FILE, size=10), used_members=10) is Action.REFUSE
    assert _judge(Member("f", MemberKind.FILE, size=11), used_bytes=990) is Action.REFUSE
    assert _judge(Member("f", MemberKind.FILE, size=10), used_bytes=990) is Action.EXTRACT


def test_whiteouts_name_the_hidden_path_and_opaque_markers_their_directory() -> None:
    whiteout = judge(
        Member("etc/.wh.passwd", MemberKind.FILE),
        extracted=frozenset(),
        used_bytes=0,
        used_members=0,
        limits=LIMITS,
    )
    assert (whiteout.action, whiteout.path) == (Action.WHITEOUT, "etc/passwd")
    opaque = judge(
        Member("var/cache/.wh..wh..opq", MemberKind.FILE),
        extracted=frozenset(),
        used_bytes=0,
        used_members=0,
        limits=LIMITS,
    )
    assert (opaque.action, opaque.path) == (Action.OPAQUE, "var/cache")


def test_whiteout_cannot_climb_out_of_the_root() -> None:
    assert _judge(Member("a/.wh...", MemberKind.FILE)) is Action.REFUSE
    assert _judge(Member("../.wh.x", MemberKind.FILE)) is Action.REFUSE


def test_root_directory_entry_is_skipped() -> None:
    assert _judge(Member("./", MemberKind.DIR)) is Action.SKIP


def test_tally_counts_directories_a_path_implies_as_entries_once() -> None:
    tally = UnpackTally(UnpackLimits(max_bytes=1000, max_members=100, entry_bytes=10))
    assert tally.admit(Member("a/b/c/f", MemberKind.FILE, size=5)).action is Action.EXTRACT
    assert tally.entries == 4  # a, a/b, a/b/c and the file
    assert tally.admit(Member("a/b/g", MemberKind.FILE, size=7)).action is Action.EXTRACT
    assert tally.entries == 5
    assert (tally.file_bytes, tally.charged_bytes) == (12, 12 + 5 * 10)


def test_one_deep_member_crossing_the_entry_limit_with_its_implied_directories_is_refused() -> None:
    tally = UnpackTally(UnpackLimits(max_members=50))
    deep = "/".join(["d"] * 60) + "/f"
    verdict = tally.admit(Member(deep, MemberKind.FILE))
    assert verdict.action is Action.REFUSE and "50 entries" in verdict.reason
    assert tally.entries == 0  # a refused member counts nothing


def test_tally_refuses_bytes_past_the_limit_over_all_layers_of_an_image() -> None:
    tally = UnpackTally(UnpackLimits(max_bytes=100))
    assert tally.admit(Member("a", MemberKind.FILE, size=60)).action is Action.EXTRACT
    assert tally.admit(Member("a", MemberKind.FILE, size=60)).action is Action.REFUSE


def test_whiteouts_imply_no_directories() -> None:
    tally = UnpackTally(UnpackLimits())
    assert tally.admit(Member("x/y/.wh.z", MemberKind.FILE)).action is Action.WHITEOUT
    assert tally.entries == 1


def test_a_member_deeper_than_the_path_depth_limit_is_refused_naming_the_limit() -> None:
    tally = UnpackTally(UnpackLimits())
    at_limit = "/".join(["d"] * 255) + "/f"  # 256 components
    assert tally.admit(Member(at_limit, MemberKind.FILE)).action is Action.EXTRACT
    for deeper in (at_limit + "/g", "/".join(["a"] * 2000)):
        verdict = tally.admit(Member(deeper, MemberKind.DIR))
        assert verdict.action is Action.REFUSE and "deeper than 256 components" in verdict.reason


def test_the_path_depth_limit_counts_normalised_components_and_holds_for_whiteouts() -> None:
    limits = UnpackLimits(max_path_depth=3)
    tally = UnpackTally(limits)
    assert tally.admit(Member("./a//b/./c", MemberKind.FILE)).action is Action.EXTRACT
    assert tally.admit(Member("a/b/c/.wh.d", MemberKind.FILE)).action is Action.REFUSE
    assert tally.admit(Member("a/b/c/d", MemberKind.FILE)).action is Action.REFUSE
