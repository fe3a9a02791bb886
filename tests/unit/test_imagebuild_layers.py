"""COPY into a layer: Docker's destination rules, ownership, and a deterministic tar."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from thaw.dockerignore import parse_dockerignore
from thaw.imagelayers import (
    BuildContext,
    CopyError,
    Owner,
    copy_entries,
    directory_entry,
    layer_tar,
    owner_of,
)

PASSWD = "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"
GROUP = "root:x:0:\napp:x:1000:\nstaff:x:50:\n"


@pytest.fixture
def context(tmp_path: Path) -> BuildContext:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "app.py").write_text("print('hi')\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o700)
    (tmp_path / "secret.env").write_text("KEY=1\n")
    os.symlink("app.py", tmp_path / "link.py")
    return BuildContext(tmp_path, parse_dockerignore("*.env\n"))


def members(data: bytes) -> list[tuple[str, int, int, str]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return [(m.name, m.uid, m.mode, m.linkname) for m in archive]


def test_a_directory_source_copies_its_contents_into_the_destination(
        context: BuildContext) -> None:
    entries = copy_entries(context, ["src"], "/srv/")
    assert [e.path for e in entries] == ["srv", "srv/pkg", "srv/pkg/mod.py"]


def test_a_file_goes_to_the_destination_or_into_it_when_it_ends_in_a_slash(
        context: BuildContext) -> None:
    assert [e.path for e in copy_entries(context, ["app.py"], "/srv/main.py")] == [
        "srv/main.py"]
    assert [e.path for e in copy_entries(context, ["app.py"], "/srv/")] == ["srv/app.py"]


def test_several_sources_need_a_destination_ending_in_a_slash(context: BuildContext) -> None:
    with pytest.raises(CopyError, match="must end in /"):
        copy_entries(context, ["app.py", "run.sh"], "/srv")


def test_globs_expand_within_the_context_and_ignored_files_are_invisible(
        context: BuildContext) -> None:
    assert [e.path for e in copy_entries(context, ["*.py", "*.sh"], "/a/")] == [
        "a/app.py", "a/link.py", "a/run.sh"]
    with pytest.raises(CopyError, match="not found"):
        copy_entries(context, ["secret.env"], "/a/")
    assert "secret.env" not in [e.path for e in copy_entries(context, ["."], "/")]


def test_sources_outside_the_context_are_refused(context: BuildContext, tmp_path: Path) -> None:
    with pytest.raises(CopyError, match="outside the build context"):
        copy_entries(context, ["../etc/passwd"], "/x")
    os.symlink("/etc", tmp_path / "etc-link")
    with pytest.raises(CopyError, match="through a symlink"):
        copy_entries(context, ["etc-link/passwd"], "/x")


def test_the_tar_is_sorted_dated_zero_owned_by_root_with_normalised_modes(
        context: BuildContext) -> None:
    data = layer_tar(copy_entries(context, ["."], "/app/"))
    assert members(data) == [
        ("app", 0, 0o755, ""), ("app/app.py", 0, 0o644, ""), ("app/link.py", 0, 0o777, "app.py"),
        ("app/run.sh", 0, 0o755, ""), ("app/src", 0, 0o755, ""), ("app/src/pkg", 0, 0o755, ""),
        ("app/src/pkg/mod.py", 0, 0o644, "")]
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        assert {m.mtime for m in archive} == {0}
    assert layer_tar(copy_entries(context, ["."], "/app/")) == data


def test_chown_and_chmod_apply_to_what_is_copied_but_not_to_a_workdir_made_first(
        context: BuildContext) -> None:
    entries = [directory_entry("/srv"),
               *copy_entries(context, ["src"], "/srv/", owner=Owner(1000, 1000), mode=0o750)]
    assert members(layer_tar(entries)) == [
        ("srv", 0, 0o755, ""), ("srv/pkg", 1000, 0o750, ""), ("srv/pkg/mod.py", 1000, 0o750, "")]


@pytest.mark.parametrize("spec, owner", [
    ("1000", Owner(1000, 1000)), ("1000:50", Owner(1000, 50)), ("app", Owner(1000, 1000)),
    ("app:staff", Owner(1000, 50)), ("0:app", Owner(0, 1000)),
])
def test_chown_takes_ids_or_names_from_the_images_passwd_and_group(
        spec: str, owner: Owner) -> None:
    assert owner_of(spec, lambda: PASSWD, lambda: GROUP) == owner


def test_chown_to_a_name_the_image_does_not_have_is_refused() -> None:
    with pytest.raises(CopyError, match="no user 'nobody'"):
        owner_of("nobody", lambda: PASSWD, lambda: GROUP)
