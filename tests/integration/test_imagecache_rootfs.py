"""The unpacked rootfs: diff_ids verified, links resolved inside the root, size charged and bounded.

Images come from OCI layouts under the test's own directory; a refused image
must leave no rootfs (temp or final) and no record.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

from imagecache.api import Image
from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.core.tarsafety import UnpackLimits
from imagecache.errors import ImageError
from tests.support.oci_layout import (
    Entry,
    add_image,
    diff_id,
    layer_tar,
    single_image_layout,
    write_layout,
)

pytestmark = pytest.mark.integration

GIB = 1024**3
MIB = 1024**2
REPO = Path(__file__).resolve().parents[2]


def _cache(
    tmp_path: Path, budget_bytes: int = GIB, limits: UnpackLimits | None = None
) -> ImageCache:
    policy = EgressPolicy.build(layout_dirs=[str(tmp_path)])
    return ImageCache(tmp_path / "cache", budget_bytes=budget_bytes, policy=policy, limits=limits)


async def _pull(cache: ImageCache, ref: str) -> Image:
    try:
        return await cache.pull(ref)
    finally:
        await cache.close()


async def _refused(cache: ImageCache, ref: str) -> ImageError:
    """Pull `ref`: it must fail, leaving no rootfs, temp tree or record behind."""
    with pytest.raises(ImageError) as caught:
        await _pull(cache, ref)
    assert os.listdir(cache.root / "rootfs") == []
    assert [p for p in os.listdir(cache.root / "images") if p.endswith((".json", ".usage"))] == []
    return caught.value


def _ref(tmp_path: Path, layers: list[list[Entry]], **kwargs: list[str]) -> str:
    return single_image_layout(tmp_path / "layout", [layer_tar(x) for x in layers], **kwargs)


async def test_a_wrong_diff_id_refuses_the_image_and_leaves_no_rootfs(tmp_path: Path) -> None:
    layers = [[Entry("a", data=b"lower")], [Entry("b", data=b"upper")]]
    wrong = diff_id(layer_tar([Entry("b", data=b"other")]))
    right = diff_id(layer_tar(layers[0]))
    error = await _refused(_cache(tmp_path), _ref(tmp_path, layers, diff_ids=[right, wrong]))
    assert error.code == "digest_mismatch"
    assert f"not to its diff_id {wrong}" in error.message


async def test_a_config_with_fewer_diff_ids_than_layers_is_refused(tmp_path: Path) -> None:
    layers = [[Entry("a")], [Entry("b")]]
    ref = _ref(tmp_path, layers, diff_ids=[diff_id(layer_tar(layers[0]))])
    error = await _refused(_cache(tmp_path), ref)
    assert error.code == "digest_mismatch" and "1 diff_ids for 2 layers" in error.message


async def test_a_link_climbing_through_a_link_to_the_root_is_refused(tmp_path: Path) -> None:
    # Lexically `b/b/b/../..` stays inside; on the host `b` is the root itself,
    # so the two `..` climb above it.
    entries = [Entry("b", kind="symlink", linkname="."),
               Entry("a", kind="symlink", linkname="b/b/b/../..")]
    error = await _refused(_cache(tmp_path), _ref(tmp_path, [entries]))
    assert error.code == "unsafe_layer"
    assert "symlink 'a' -> 'b/b/b/../..': climbs above the root" in error.message


async def test_a_link_that_a_later_layer_turns_into_an_escape_is_refused(tmp_path: Path) -> None:
    lower = [Entry("a", kind="symlink", linkname="x/y/z/../../..")]  # x, y, z missing: inside
    upper = [Entry(name, kind="symlink", linkname=".") for name in ("x", "y", "z")]
    error = await _refused(_cache(tmp_path), _ref(tmp_path, [lower, upper]))
    assert error.code == "unsafe_layer" and "'a'" in error.message


async def test_links_that_climb_only_through_deeper_links_unpack(tmp_path: Path) -> None:
    entries = [
        Entry("usr/lib/deep", kind="dir", mode=0o755),
        Entry("usr/bin/X11", kind="symlink", linkname="."),  # Debian's x11-common
        Entry("s", kind="symlink", linkname="usr/lib/deep"),
        Entry("up", kind="symlink", linkname="s/../.."),  # lexically above the root; really usr
        Entry("lib", kind="symlink", linkname="/usr/lib"),
        Entry("dangling", kind="symlink", linkname="nowhere/yet"),
    ]
    image = await _pull(_cache(tmp_path), _ref(tmp_path, [entries]))
    root = Path(image.rootfs)
    assert os.readlink(root / "up") == "s/../.."
    assert os.readlink(root / "usr/bin/X11") == "."


async def test_a_layer_expanding_past_the_per_image_limit_leaves_no_rootfs(tmp_path: Path) -> None:
    bomb = layer_tar([Entry("zeros", data=bytes(10 * MIB))])  # ~10 KiB of gzip
    assert len(bomb) < 64 * 1024
    ref = single_image_layout(tmp_path / "layout", [bomb])
    cache = _cache(tmp_path, limits=UnpackLimits(max_bytes=MIB))
    error = await _refused(cache, ref)
    assert error.code == "unsafe_layer" and f"unpacked size over {MIB} bytes" in error.message


async def test_directories_implied_by_deep_paths_count_against_the_entry_limit(
    tmp_path: Path,
) -> None:
    deep = [Entry("/".join(f"d{n}" for n in range(200)) + "/f", data=b"x")]  # 1 member, 201 entries
    cache = _cache(tmp_path, limits=UnpackLimits(max_members=100))
    error = await _refused(cache, _ref(tmp_path, [deep]))
    assert error.code == "unsafe_layer" and "more than 100 entries" in error.message


async def test_a_rootfs_larger_than_the_room_in_the_budget_is_refused_before_it_is_written(
    tmp_path: Path,
) -> None:
    bomb = layer_tar([Entry("zeros", data=bytes(10 * MIB))])
    ref = single_image_layout(tmp_path / "layout", [bomb])
    error = await _refused(_cache(tmp_path, budget_bytes=4 * MIB), ref)
    assert error.code == "no_space"
    assert f"do not fit the cache budget of {4 * MIB} bytes" in error.message


async def test_empty_directories_are_charged_against_the_budget(tmp_path: Path) -> None:
    dirs = [Entry(f"d{n}", kind="dir", mode=0o755) for n in range(2000)]  # 2000 * 4 KiB charged
    error = await _refused(_cache(tmp_path, budget_bytes=4 * MIB), _ref(tmp_path, [dirs]))
    assert error.code == "no_space"
    image = await _pull(_cache(tmp_path, budget_bytes=16 * MIB), _ref(tmp_path, [dirs]))
    assert len(os.listdir(image.rootfs)) == 2000


async def test_a_pax_header_of_megabytes_is_refused_before_it_is_held_in_memory(
    tmp_path: Path,
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("f")
        info.pax_headers = {"comment": "x" * (2 * MIB)}
        archive.addfile(info, io.BytesIO(b""))
    ref = single_image_layout(tmp_path / "layout", [gzip.compress(buffer.getvalue())])
    error = await _refused(_cache(tmp_path), ref)
    assert error.code == "unsafe_layer" and "more tar data than its members" in error.message


async def test_megabytes_after_the_end_of_the_archive_are_refused(tmp_path: Path) -> None:
    padded = layer_tar([Entry("a", data=b"x")], compress=False) + bytes(2 * MIB)
    ref = single_image_layout(tmp_path / "layout", [gzip.compress(padded)])
    error = await _refused(_cache(tmp_path), ref)
    assert error.code == "unsafe_layer" and "more tar data than its members" in error.message


def _three_images(tmp_path: Path) -> dict[str, str]:
    """Three one-layer images whose layers are small and whose rootfs are 1 MiB each."""
    layout = tmp_path / "layout"
    descs = {
        tag: add_image(layout, [layer_tar([Entry(tag, data=tag.encode() * (MIB // len(tag)))])])
        for tag in ("one", "two", "three")
    }
    write_layout(layout, descs)
    return {tag: f"oci:{layout}:{tag}" for tag in descs}


async def test_an_unpacked_rootfs_evicts_lru_unpinned_images_to_fit_the_budget(
    tmp_path: Path,
) -> None:
    refs = _three_images(tmp_path)
    cache = _cache(tmp_path, budget_bytes=3 * MIB)  # blobs are ~1 KiB: only rootfs weigh
    try:
        one = await cache.pull(refs["one"])
        cache.pin("m-1", one.digest)
        two = await cache.pull(refs["two"])
        assert cache.used_bytes() > 2 * MIB
        three = await cache.pull(refs["three"])  # two's rootfs makes room
        assert cache.image(two.digest) is None
        assert cache.image(one.digest) == one and cache.image(three.digest) == three
        assert cache.used_bytes() <= 3 * MIB
        kept = sorted(Path(image.rootfs).name for image in (one, three))
        assert sorted(os.listdir(cache.root / "rootfs")) == kept
    finally:
        await cache.close()


async def test_an_image_whose_rootfs_cannot_fit_beside_pinned_ones_is_refused(
    tmp_path: Path,
) -> None:
    refs = _three_images(tmp_path)
    cache = _cache(tmp_path, budget_bytes=3 * MIB)
    try:
        for tag in ("one", "two"):
            cache.pin(tag, (await cache.pull(refs[tag])).digest)
        with pytest.raises(ImageError) as caught:
            await cache.pull(refs["three"])
        assert caught.value.code == "no_space"
        assert "unpacked, at least" in caught.value.message
        assert "held by pinned images and pulls in flight" in caught.value.message
        assert len(os.listdir(cache.root / "rootfs")) == 2  # no partial third
        assert cache.used_bytes() <= 3 * MIB
    finally:
        await cache.close()


async def test_a_restarted_cache_keeps_rootfs_usage_and_drops_trees_no_record_names(
    tmp_path: Path,
) -> None:
    refs = _three_images(tmp_path)
    first = _cache(tmp_path)
    image = await _pull(first, refs["one"])
    used = first.used_bytes()
    orphan = first.root / "rootfs" / ("f" * 64)
    orphan.mkdir()
    (orphan / "junk").write_bytes(b"x" * 1000)
    second = _cache(tmp_path)
    await second.close()
    assert second.used_bytes() == used and second.image(image.digest) == image
    assert not orphan.exists()


async def test_a_rootfs_from_before_links_were_checked_is_dropped_if_a_link_escapes(
    tmp_path: Path,
) -> None:
    refs = _three_images(tmp_path)
    first = _cache(tmp_path)
    image = await _pull(first, refs["one"])
    os.symlink(".", Path(image.rootfs) / "b")  # as the lexical rule let through
    os.symlink("b/b/../..", Path(image.rootfs) / "a")
    (first.root / "images" / (image.digest[7:] + ".usage")).unlink()  # an older cache
    second = _cache(tmp_path)
    await second.close()
    assert second.image(image.digest) is None
    assert os.listdir(second.root / "rootfs") == []


_PULL_WITH_SMALL_FILES = """
import asyncio, json, resource, signal, sys
from pathlib import Path

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.errors import ImageError

async def main():
    policy = EgressPolicy.build(layout_dirs=[sys.argv[2]])
    cache = ImageCache(Path(sys.argv[1]), budget_bytes=1 << 30, policy=policy)
    try:
        await cache.pull(sys.argv[3])
        print(json.dumps({"pulled": True}))
    except ImageError as exc:
        print(json.dumps({"code": exc.code, "message": exc.message}))
    finally:
        await cache.close()

asyncio.run(main())
"""


async def test_a_file_system_error_while_unpacking_is_an_image_error_and_leaves_no_rootfs(
    tmp_path: Path,
) -> None:
    big = gzip.compress(layer_tar([Entry("big", data=bytes(MIB))], compress=False))
    ref = single_image_layout(tmp_path / "layout", [big])
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PULL_WITH_SMALL_FILES, str(tmp_path / "cache"), str(tmp_path), ref,
        cwd=str(REPO), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, err.decode()[-2000:]
    layer = hashlib.sha256(big).hexdigest()
    assert json.loads(out) == {
        "code": "io_error",
        "message": f"unpacking layer {layer}: File too large",
    }
    assert os.listdir(tmp_path / "cache" / "rootfs") == []
