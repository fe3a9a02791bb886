"""Unpacking layers from OCI layouts: hostile members are refused, whiteouts honoured."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imagecache.api import LayerChange
from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.core.tarsafety import UnpackLimits
from imagecache.errors import ImageError
from tests.support.image_pulls import refused_pull
from tests.support.oci_layout import (
    Entry,
    add_image,
    add_index,
    layer_tar,
    single_image_layout,
    write_layout,
)
from thaw.imagebuild import build_image

pytestmark = pytest.mark.integration

GIB = 1024**3
HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


def _layouts_under(tmp_path: Path) -> EgressPolicy:
    """A policy that allows reading layouts under the test's own directory, and nothing else."""
    return EgressPolicy.build(layout_dirs=[str(tmp_path)])


async def _pull(tmp_path: Path, ref: str) -> tuple[ImageCache, object]:
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_layouts_under(tmp_path))
    try:
        return cache, await cache.pull(ref)
    finally:
        await cache.close()


async def _refused(tmp_path: Path, layers: list[list[Entry]]) -> ImageError:
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    ref = single_image_layout(tmp_path / "layout", [layer_tar(entries) for entries in layers])
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_layouts_under(tmp_path))
    error = await refused_pull(cache, ref)
    assert list(sentinel.iterdir()) == []
    assert list((tmp_path / "cache" / "rootfs").iterdir()) == []
    assert not (tmp_path / "x").exists() and not (tmp_path / "cache" / "x").exists()
    assert cache.image(ref) is None
    return error


@pytest.mark.parametrize(
    ("entries", "member"),
    [
        ([Entry("ok"), Entry("../x", data=b"boom")], "../x"),
        ([Entry("/etc/x", data=b"boom")], "/etc/x"),
        ([Entry("a/../../x", data=b"boom")], "a/../../x"),
        ([Entry("up", kind="symlink", linkname="../../../sentinel")], "up"),
        ([Entry("lnk", kind="hardlink", linkname="/etc/passwd")], "lnk"),
        ([Entry("lnk", kind="hardlink", linkname="../sentinel/f")], "lnk"),
        ([Entry("lnk", kind="hardlink", linkname="later"), Entry("later")], "lnk"),
        ([Entry("dev/null", kind="chr")], "dev/null"),
        ([Entry("pipe", kind="fifo")], "pipe"),
        ([Entry("bin/su", data=b"x", mode=0o4755)], "bin/su"),
        ([Entry("bin/sg", data=b"x", mode=0o2755)], "bin/sg"),
    ],
)
async def test_hostile_member_refuses_the_layer_and_writes_nothing_outside(
    tmp_path: Path, entries: list[Entry], member: str
) -> None:
    error = await _refused(tmp_path, [entries])
    assert error.code == "unsafe_layer"
    assert repr(member) in str(error)


async def test_write_through_a_symlink_from_the_same_layer_is_refused(tmp_path: Path) -> None:
    target = str(tmp_path / "sentinel")  # absolute: lexically "inside" the container root
    entries = [Entry("evil", kind="symlink", linkname=target), Entry("evil/x", data=b"pwned")]
    error = await _refused(tmp_path, [entries])
    assert error.code == "unsafe_layer" and "symlink" in str(error)


async def test_write_through_a_symlink_from_a_lower_layer_is_refused(tmp_path: Path) -> None:
    target = str(tmp_path / "sentinel")
    lower = [
        Entry("etc", kind="dir", mode=0o755),
        Entry("etc/evil", kind="symlink", linkname=target),
    ]
    upper = [Entry("etc/evil/x", data=b"pwned")]
    error = await _refused(tmp_path, [lower, upper])
    assert error.code == "unsafe_layer"


async def test_unpacked_size_over_the_limit_is_refused(tmp_path: Path) -> None:
    ref = single_image_layout(tmp_path / "layout", [layer_tar([Entry("big", data=b"x" * 2000)])])
    cache = ImageCache(
        tmp_path / "cache",
        budget_bytes=GIB,
        policy=_layouts_under(tmp_path),
        limits=UnpackLimits(max_bytes=1000),
    )
    error = await refused_pull(cache, ref)
    assert error.code == "unsafe_layer" and "1000 bytes" in str(error)


async def test_whiteout_in_an_upper_layer_deletes_the_lower_file(tmp_path: Path) -> None:
    lower = [Entry("etc", kind="dir", mode=0o755), Entry("etc/keep"), Entry("etc/secret")]
    upper = [Entry("etc/.wh.secret")]
    ref = single_image_layout(tmp_path / "layout", [layer_tar(lower), layer_tar(upper)])
    _, image = await _pull(tmp_path, ref)
    root = Path(image.rootfs)  # type: ignore[attr-defined]
    assert (root / "etc" / "keep").is_file()
    assert not (root / "etc" / "secret").exists()
    assert not (root / "etc" / ".wh.secret").exists()


async def test_opaque_directory_clears_lower_content_but_keeps_its_own(tmp_path: Path) -> None:
    lower = [Entry("var/cache", kind="dir", mode=0o755), Entry("var/cache/old"), Entry("var/other")]
    upper = [Entry("var/cache/new", data=b"n"), Entry("var/cache/.wh..wh..opq")]
    ref = single_image_layout(tmp_path / "layout", [layer_tar(lower), layer_tar(upper)])
    _, image = await _pull(tmp_path, ref)
    root = Path(image.rootfs)  # type: ignore[attr-defined]
    assert sorted(p.name for p in (root / "var" / "cache").iterdir()) == ["new"]
    assert (root / "var" / "other").is_file()


async def test_safe_links_and_uncompressed_layers_unpack(tmp_path: Path) -> None:
    entries = [
        Entry("usr/bin", kind="dir", mode=0o755),
        Entry("usr/bin/tool", data=b"#!/bin/sh\n", mode=0o755),
        Entry("usr/bin/alias", kind="hardlink", linkname="usr/bin/tool"),
        Entry("bin", kind="symlink", linkname="usr/bin"),
        Entry("abs", kind="symlink", linkname="/usr/bin/tool"),
    ]
    ref = single_image_layout(tmp_path / "layout", [layer_tar(entries, compress=False)])
    _, image = await _pull(tmp_path, ref)
    root = Path(image.rootfs)  # type: ignore[attr-defined]
    assert os.readlink(root / "bin") == "usr/bin"
    assert (root / "usr/bin/alias").stat().st_ino == (root / "usr/bin/tool").stat().st_ino
    assert os.access(root / "usr/bin/tool", os.X_OK)


async def test_layout_index_pointing_at_a_multi_platform_index_picks_linux_amd64(
    tmp_path: Path,
) -> None:
    layout = tmp_path / "layout"
    arm = add_image(layout, [layer_tar([Entry("arch", data=b"arm64")])])
    amd = add_image(layout, [layer_tar([Entry("arch", data=b"amd64")])])
    index = add_index(layout, {("linux", "arm64"): arm, ("linux", "amd64"): amd})
    write_layout(layout, {"multi": index})
    cache, image = await _pull(tmp_path, f"oci:{layout}:multi")
    assert (Path(image.rootfs) / "arch").read_bytes() == b"amd64"  # type: ignore[attr-defined]
    assert image.digest == amd["digest"]  # type: ignore[attr-defined]
    assert cache.image(index["digest"]) == image


async def test_built_layout_of_hello_pulls_and_rebuilding_is_deterministic(
    tmp_path: Path,
) -> None:
    layout = tmp_path / "layout"
    digest = build_image(HELLO, "hello:v1", layout=layout)
    assert build_image(HELLO, "hello:v1", layout=layout) == digest
    build_image(HELLO, "hello:v2", layout=layout)
    _, image = await _pull(tmp_path, f"oci:{layout}:v1")
    assert image.digest == digest  # type: ignore[attr-defined]
    assert (Path(image.rootfs) / "app" / "app.py").is_file()  # type: ignore[attr-defined]


async def test_eviction_removes_lru_unpinned_rootfs_then_layers_never_pinned_ones(
    tmp_path: Path,
) -> None:
    layout = tmp_path / "layout"
    descs = {
        tag: add_image(layout, [layer_tar([Entry(tag, data=os.urandom(4000))])])
        for tag in ("one", "two", "three")
    }
    write_layout(layout, descs)
    changes: list[LayerChange] = []
    cache = ImageCache(
        tmp_path / "cache",
        budget_bytes=GIB,
        policy=_layouts_under(tmp_path),
        on_change=changes.append,
    )
    try:
        one = await cache.pull(f"oci:{layout}:one")
        footprint = cache.used_bytes()  # its blob and its unpacked rootfs
        cache.pin("machine-1", one.digest)
        cache.budget_bytes = footprint * 5 // 2
        two = await cache.pull(f"oci:{layout}:two")
        three = await cache.pull(f"oci:{layout}:three")  # over budget: two's rootfs goes
        assert cache.image(two.digest) is None
        assert two.layers[0].digest in cache.layers()  # a rootfs goes before its blobs
        assert cache.used_bytes() <= cache.budget_bytes
        cache.budget_bytes = footprint
        assert cache.evict() == [two.layers[0].digest, three.layers[0].digest]  # one is pinned
        assert cache.image(three.digest) is None and cache.image(one.digest) == one
        cache.unpin("machine-1")
        cache.budget_bytes = 0
        assert cache.evict() == [one.layers[0].digest]
        assert cache.used_bytes() == 0
    finally:
        await cache.close()
    assert [(c.digest, c.present) for c in changes] == [
        (one.layers[0].digest, True),
        (two.layers[0].digest, True),
        (three.layers[0].digest, True),
        (two.layers[0].digest, False),
        (three.layers[0].digest, False),
        (one.layers[0].digest, False),
    ]
    assert list((tmp_path / "cache" / "rootfs").iterdir()) == []
    assert list((tmp_path / "cache" / "images").iterdir()) == []


async def test_temp_files_from_a_killed_download_are_swept_at_start(tmp_path: Path) -> None:
    blobs = tmp_path / "cache" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / (".tmp-" + "a" * 64 + "-dead")).write_bytes(b"partial")
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB)
    await cache.close()
    assert list(blobs.iterdir()) == []
    assert cache.layers() == {}


async def test_a_name_repeated_in_one_layer_ends_as_its_last_entry(tmp_path: Path) -> None:
    entries = [
        Entry("a", data=b"first"),
        Entry("b", data=b"old"),
        Entry("b", kind="hardlink", linkname="a"),
    ]
    ref = single_image_layout(tmp_path / "layout", [layer_tar(entries)])
    _, image = await _pull(tmp_path, ref)
    root = Path(image.rootfs)  # type: ignore[attr-defined]
    assert (root / "b").read_bytes() == b"first"
    assert (root / "b").stat().st_ino == (root / "a").stat().st_ino


def _temp_trees(cache_root: Path) -> list[str]:
    return [name for name in os.listdir(cache_root / "rootfs") if name.startswith(".tmp-")]


async def test_a_tree_too_deep_for_the_file_system_is_refused_and_its_temp_tree_removed_whole(
    tmp_path: Path,
) -> None:
    # Past the depth limit's default, the plan lets 2000 levels through; writing them
    # fails when the path outgrows PATH_MAX, with ~2000 levels on disk to remove.
    deep = [Entry("a/" * 2000 + "f", data=b"x")]
    ref = single_image_layout(tmp_path / "layout", [layer_tar(deep)])
    cache = ImageCache(
        tmp_path / "cache",
        budget_bytes=GIB,
        policy=_layouts_under(tmp_path),
        limits=UnpackLimits(max_path_depth=5000),
    )
    error = await refused_pull(cache, ref)
    assert error.code == "unsafe_layer" and "File name too long" in str(error)
    assert os.listdir(tmp_path / "cache" / "rootfs") == []
    again = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_layouts_under(tmp_path))
    await again.close()
    assert again.image(ref) is None


async def test_an_unforeseen_error_while_unpacking_is_an_io_error_and_leaves_no_temp_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def overflow(root: Path, _limits: UnpackLimits) -> int:
        assert _temp_trees(tmp_path / "cache") == [root.name]  # written, then it fails
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("imagecache.adapters.unpack.inspect_rootfs", overflow)
    ref = single_image_layout(tmp_path / "layout", [layer_tar([Entry("a/b/c", data=b"x")])])
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_layouts_under(tmp_path))
    try:
        with pytest.raises(ImageError) as caught:
            await cache.pull(ref)
        assert cache.image(ref) is None
    finally:
        await cache.close()
    assert caught.value.code == "io_error"
    assert caught.value.message == f"pull of {ref}: RecursionError"
    assert os.listdir(tmp_path / "cache" / "rootfs") == []
