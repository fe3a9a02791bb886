"""Debian packages to a rootfs: the dependency walk's choices and merged /usr's paths."""

from __future__ import annotations

import io
import tarfile

from thaw.debroot import DebTree, aimed_link, merged_path, parse_depends, pick

DEPENDS = """\
base-files
  PreDepends: <awk>
    gawk
    mawk
libpython3.11-stdlib
  Depends: libpython3.11-minimal
 |Depends: media-types
  Depends: mime-support
  Depends: libc6
dash
  PreDepends: libc6
  Depends: debianutils
"""


def test_depends_output_parses_into_groups_of_alternatives_with_virtual_providers() -> None:
    assert parse_depends(DEPENDS) == {
        "base-files": [["<awk>", "gawk", "mawk"]],
        "libpython3.11-stdlib": [["libpython3.11-minimal"], ["media-types", "mime-support"],
                                 ["libc6"]],
        "dash": [["libc6"], ["debianutils"]],
    }


def test_the_first_alternative_is_taken_unless_one_is_already_chosen() -> None:
    assert pick(["media-types", "mime-support"], set()) == "media-types"
    assert pick(["media-types", "mime-support"], {"mime-support"}) is None


def test_packages_a_single_program_does_not_need_are_skipped() -> None:
    assert pick(["<awk>", "gawk", "mawk"], set()) is None
    assert pick(["debianutils"], set()) is None
    assert pick(["perl-base"], set()) is None


def test_paths_under_bin_sbin_and_lib_move_under_usr() -> None:
    assert [merged_path(p) for p in ("bin/dash", "lib64/ld.so", "usr/bin/x", "etc/a")] == [
        "usr/bin/dash", "usr/lib64/ld.so", "usr/bin/x", "etc/a"]


def test_symlinks_are_re_aimed_where_both_ends_moved() -> None:
    assert aimed_link("bin/sh", "dash") == "dash"
    assert aimed_link("lib64/ld-linux-x86-64.so.2",
                      "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2") == (
        "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    assert aimed_link("sbin/tool", "../usr/bin/tool") == "../bin/tool"
    assert aimed_link("usr/lib/x/libz.so", "../../../lib/x/libz.so.1") == "libz.so.1"
    assert aimed_link("etc/os-release", "../usr/lib/os-release") == "../usr/lib/os-release"


def test_the_tree_is_written_sorted_with_parents_first() -> None:
    tree = DebTree()
    tree.add_file("usr/bin/z", b"z")
    tree.add_symlink("bin", "usr/bin")
    tree.add_dir("usr")
    tree.add_dir("usr/bin")
    tree.add_dir("tmp", 0o1777)
    tree.ensure_dir("usr")
    with tarfile.open(fileobj=io.BytesIO(tree.tar_bytes())) as archive:
        listed = [(m.name, m.mode) for m in archive]
    assert listed == [("bin", 0o777), ("tmp", 0o1777), ("usr", 0o755), ("usr/bin", 0o755),
                      ("usr/bin/z", 0o644)]
