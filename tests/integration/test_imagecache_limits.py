"""What a hostile or broken registry cannot make a pull do: fill the disk, hang, run out of files.

Real sockets on loopback: a hand-made registry (`StaticRegistry`) for what a
real one will not serve (a 50 GiB endless blob, 3,000 layers), and the
tampering proxy in front of docker-registry for a drip-fed blob or manifest.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from imagecache.cache import ImageCache
from imagecache.core.budget import DownloadLimits
from imagecache.core.egress import EgressPolicy
from imagecache.resolver import ImageResolver
from tests.support import docker_registry as registry_support
from tests.support.docker_registry import DockerRegistry
from tests.support.image_pulls import refused_pull
from tests.support.oci_layout import Entry, image_blobs, layer_tar
from tests.support.registry_proxy import RegistryProxy, StaticRegistry
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = pytest.mark.integration
docker_registry = registry_support.docker_registry  # the session fixture, by name

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "examples" / "hello"
# examples/hello without its python base: these tests are about the cache's pulls
SCRATCH = BuildOverrides(base="scratch")
GIB = 1024**3
MIB = 1024**2
ENDLESS = "sha256:" + "e" * 64  # a digest no content has: the blob never ends anyway


@pytest.fixture
async def registry() -> AsyncIterator[StaticRegistry]:
    async with StaticRegistry() as running:
        yield running


def _listing(host: str) -> EgressPolicy:
    return EgressPolicy.build([host], listed_only=True)


def _endless_image(registry: StaticRegistry, declared: int) -> str:
    """An image whose one layer is declared `declared` bytes and never ends; its reference."""
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ENDLESS,
             "size": declared}
    manifest, blobs = image_blobs([b""], descriptors=[layer])
    registry.put_image("endless", "v1", manifest, blobs)
    registry.endless.add(ENDLESS)
    return f"{registry.host}/endless:v1"


def _files_under(root: Path) -> tuple[int, list[str]]:
    """(bytes of every regular file under root, names of leftover temp files)."""
    total, temps = 0, []
    for directory, _, names in os.walk(root):
        for name in names:
            total += os.lstat(os.path.join(directory, name)).st_size
            if name.startswith(".tmp-"):
                temps.append(name)
    return total, temps


async def test_endless_blob_declared_at_50_gib_stops_at_the_budget_and_leaves_nothing(
    tmp_path: Path, registry: StaticRegistry
) -> None:
    ref = _endless_image(registry, declared=50 * GIB)
    budget = 8 * MIB
    cache = ImageCache(tmp_path / "cache", budget_bytes=budget, policy=_listing(registry.host))
    error = await refused_pull(cache, ref)
    assert error.code == "no_space"
    assert f"cache budget of {budget} bytes" in error.message
    on_disk, temps = _files_under(tmp_path / "cache")
    assert on_disk <= budget and temps == []
    assert registry.bytes_sent[ENDLESS] <= budget  # refused before the download, in fact
    assert cache.layers() == {} and cache.used_bytes() == 0


async def test_endless_blob_within_the_budget_is_cut_at_its_declared_size(
    tmp_path: Path, registry: StaticRegistry
) -> None:
    ref = _endless_image(registry, declared=2 * MIB)
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(registry.host))
    error = await refused_pull(cache, ref)
    assert error.code == "size_mismatch"
    on_disk, temps = _files_under(tmp_path / "cache")
    assert on_disk < MIB and temps == []


async def test_a_blob_that_would_take_the_disk_below_its_reserve_is_refused_before_a_byte(
    tmp_path: Path, registry: StaticRegistry
) -> None:
    ref = _endless_image(registry, declared=64 * MIB)
    reserve = 100 * MIB
    cache = ImageCache(
        tmp_path / "cache",
        budget_bytes=GIB,
        policy=_listing(registry.host),
        downloads=DownloadLimits(disk_reserve_bytes=reserve),
        disk_free=lambda _: reserve + 10 * MIB,  # 10 MiB to spare: not 64
    )
    error = await refused_pull(cache, ref)
    assert error.code == "no_space" and "free on disk above its reserve" in error.message
    assert registry.blob_gets[ENDLESS] == 0


async def test_a_disk_filling_up_during_a_download_stops_it_with_no_space(
    tmp_path: Path, registry: StaticRegistry
) -> None:
    ref = _endless_image(registry, declared=64 * MIB)

    def disk_free(_: Path) -> int:
        # Someone else fills the disk once 2 MiB of the blob have gone out.
        return 0 if registry.bytes_sent[ENDLESS] > 2 * MIB else 10 * GIB

    cache = ImageCache(
        tmp_path / "cache", budget_bytes=GIB, policy=_listing(registry.host), disk_free=disk_free
    )
    error = await refused_pull(cache, ref)
    assert error.code == "no_space" and "fell below its reserve" in error.message
    on_disk, temps = _files_under(tmp_path / "cache")
    assert on_disk < MIB and temps == []


@pytest.fixture(scope="module")
def hello_digest(docker_registry: DockerRegistry) -> str:
    return build_image(HELLO, "hello:v1", push=docker_registry.url, overrides=SCRATCH)


async def test_drip_fed_blob_is_cut_at_its_overall_deadline_though_never_idle(
    tmp_path: Path, docker_registry: DockerRegistry, hello_digest: str
) -> None:
    async with RegistryProxy(docker_registry.url) as proxy:
        manifest = await _manifest_layers(proxy)
        proxy.tamper[manifest[0]] = "drip"  # a byte every 50 ms: the read timeout never fires
        cache = ImageCache(
            tmp_path / "cache",
            budget_bytes=GIB,
            policy=_listing(proxy.host),
            http_timeout_s=5.0,
            downloads=DownloadLimits(allowance_s=0.5, min_bytes_per_s=10 * MIB),
        )
        began = time.monotonic()
        error = await refused_pull(cache, f"{proxy.host}/hello:v1")
        elapsed = time.monotonic() - began
    assert error.code == "registry_error" and "not received within 0.5 s" in error.message
    assert elapsed < 3.0
    assert _files_under(tmp_path / "cache")[1] == []


async def test_drip_fed_manifest_is_cut_at_the_resolve_deadline(
    tmp_path: Path, docker_registry: DockerRegistry, hello_digest: str
) -> None:
    async with RegistryProxy(docker_registry.url) as proxy:
        proxy.tamper["v1"] = "drip"
        cache = ImageCache(
            tmp_path / "cache",
            budget_bytes=GIB,
            policy=_listing(proxy.host),
            http_timeout_s=5.0,
            resolve_timeout_s=0.5,
        )
        began = time.monotonic()
        error = await refused_pull(cache, f"{proxy.host}/hello:v1")
        elapsed = time.monotonic() - began
    assert error.code == "registry_error" and "not resolved within 0.5 s" in error.message
    assert elapsed < 3.0


async def _manifest_layers(proxy: RegistryProxy) -> list[str]:
    resolver = ImageResolver(_listing(proxy.host))
    try:
        resolved = await resolver.resolve(f"{proxy.host}/hello:v1")
    finally:
        await resolver.close()
    return [layer.digest for layer in resolved.layers]


_MANY_LAYERS_PULL = """
import asyncio, json, resource, sys
from pathlib import Path

limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.errors import ImageError

async def main():
    policy = EgressPolicy.build([sys.argv[2].split("/")[0]], listed_only=True)
    cache = ImageCache(Path(sys.argv[1]), budget_bytes=1 << 30, policy=policy)
    try:
        image = await cache.pull(sys.argv[2])
        print(json.dumps({"layers": len(image.layers), "rootfs": image.rootfs}))
    except ImageError as exc:
        print(json.dumps({"code": exc.code, "message": exc.message}))
    finally:
        await cache.close()

asyncio.run(main())
"""


@pytest.fixture
def memory_dir(tmp_path: Path) -> Iterator[Path]:
    """A temp dir in RAM where there is one: 3,000 created and fsynced blobs cost
    seconds on a disk, and this test is about open files, not disks."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="thaw-test-") as path:
        yield Path(path)


@pytest.mark.parametrize("open_files", [256, 24])
async def test_3000_layer_manifest_under_a_low_open_files_limit_never_raises_an_oserror(
    memory_dir: Path, registry: StaticRegistry, open_files: int
) -> None:
    layers = [layer_tar([Entry(f"f{n}", data=b"%d" % n)]) for n in range(3000)]
    manifest, blobs = image_blobs(layers)
    registry.put_image("many", "v1", manifest, blobs)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _MANY_LAYERS_PULL, str(memory_dir / "cache"),
        f"{registry.host}/many:v1", str(open_files),
        cwd=str(REPO), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-2000:]
    result = json.loads(out)
    if "code" in result:  # failing is allowed, but only as an ImageError
        assert result["code"] == "io_error" and "Too many open files" in result["message"]
    else:
        assert result["layers"] == 3000
        assert len(os.listdir(result["rootfs"])) == 3000
    if open_files == 256:
        assert result.get("layers") == 3000, result  # 8 downloads at a time fit easily
    assert max(registry.blob_gets.values()) == 1
