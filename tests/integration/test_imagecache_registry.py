"""Pulling from a real docker-registry, directly and through a counting/tampering proxy."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from imagecache.api import LayerChange
from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from tests.support import docker_registry as registry_support
from tests.support.docker_registry import DockerRegistry
from tests.support.image_pulls import refused_pull
from tests.support.oci_layout import OCI_MANIFEST, Entry, image_blobs, layer_tar
from tests.support.registry_proxy import RegistryProxy
from thaw.imagebuild import Blob, BuildOverrides, BuiltImage, build_image, push_image

pytestmark = pytest.mark.integration
docker_registry = registry_support.docker_registry  # the session fixture, by name

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "examples" / "hello"
# examples/hello without its python base: these tests are about the cache's pulls
SCRATCH = BuildOverrides(base="scratch")
GIB = 1024**3


@pytest.fixture(scope="module")
def hello_digest(docker_registry: DockerRegistry) -> str:
    return build_image(HELLO, "hello:v1", push=docker_registry.url, overrides=SCRATCH)


@pytest.fixture
async def proxy(docker_registry: DockerRegistry) -> AsyncIterator[RegistryProxy]:
    async with RegistryProxy(docker_registry.url) as running:
        yield running


def _listing(*hosts: str) -> EgressPolicy:
    """A policy allowing exactly these test registries (all on loopback)."""
    return EgressPolicy.build(hosts, listed_only=True)


def _manifest(registry: DockerRegistry, reference: str) -> dict[str, object]:
    request = urllib.request.Request(
        f"{registry.url}/v2/hello/manifests/{reference}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        doc: dict[str, object] = json.loads(response.read())
        return doc


def _layer_digest(registry: DockerRegistry) -> str:
    layers = _manifest(registry, "v1")["layers"]
    assert isinstance(layers, list)
    return str(layers[0]["digest"])


async def test_pushed_hello_example_pulls_with_app_py_and_its_entrypoint(
    tmp_path: Path,
    docker_registry: DockerRegistry,
    hello_digest: str,
) -> None:
    changes: list[LayerChange] = []
    cache = ImageCache(
        tmp_path / "cache",
        budget_bytes=GIB,
        policy=EgressPolicy.build([docker_registry.host]),
        on_change=changes.append,
    )
    try:
        image = await cache.pull(f"{docker_registry.host}/hello:v1")
    finally:
        await cache.close()
    assert image.digest == hello_digest
    assert (Path(image.rootfs) / "app.py").is_file()
    assert not (Path(image.rootfs) / "thaw-image.toml").exists()
    assert image.config.entrypoint == ["python3", "app.py"]
    assert image.config.exposed_ports == ["8080/tcp"]
    assert [c.present for c in changes] == [True]
    assert cache.layers() == {image.layers[0].digest: image.layers[0].size}


def _push_layer(registry: DockerRegistry, name: str, layer: bytes) -> None:
    """Push a one-layer image of `layer` as `name:v1` (a layer no directory could give)."""
    manifest, blobs = image_blobs([layer])
    config = blobs[json.loads(manifest)["config"]["digest"]]
    built = BuiltImage(
        layers=[Blob("application/vnd.oci.image.layer.v1.tar+gzip", layer)],
        config=Blob("application/vnd.oci.image.config.v1+json", config),
        manifest=Blob(OCI_MANIFEST, manifest),
    )
    push_image(built, registry.url, name, "v1")


async def test_a_layer_of_2000_nested_directories_is_refused_and_leaves_no_temp_tree(
    tmp_path: Path, docker_registry: DockerRegistry
) -> None:
    nested = [Entry("/".join(["a"] * depth), kind="dir", mode=0o755) for depth in range(1, 2001)]
    _push_layer(docker_registry, "deep", layer_tar(nested))
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(docker_registry.host))
    error = await refused_pull(cache, f"{docker_registry.host}/deep:v1")
    assert error.code == "unsafe_layer"
    assert "deeper than 256 components" in error.message
    assert os.listdir(tmp_path / "cache" / "rootfs") == []


async def test_second_pull_of_a_cached_image_fetches_no_blob(
    tmp_path: Path, proxy: RegistryProxy, hello_digest: str
) -> None:
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(proxy.host))
    try:
        first = await cache.pull(f"{proxy.host}/hello:v1")
        fetched = sum(proxy.blob_gets.values())
        second = await cache.pull(f"{proxy.host}/hello:v1")
    finally:
        await cache.close()
    assert first == second
    assert fetched == 2  # config + one layer
    assert sum(proxy.blob_gets.values()) == fetched


async def test_twenty_concurrent_pulls_fetch_each_blob_exactly_once(
    tmp_path: Path, proxy: RegistryProxy, hello_digest: str
) -> None:
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(proxy.host))
    try:
        images = await asyncio.gather(*(cache.pull(f"{proxy.host}/hello:v1") for _ in range(20)))
    finally:
        await cache.close()
    assert {image.digest for image in images} == {hello_digest}
    layer = images[0].layers[0].digest
    assert proxy.blob_gets[layer] == 1
    assert len(list((tmp_path / "cache" / "rootfs").iterdir())) == 1


async def test_restarted_cache_knows_layers_and_image_and_pulls_pinned_ref_offline(
    tmp_path: Path, proxy: RegistryProxy, hello_digest: str
) -> None:
    first = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(proxy.host))
    try:
        image = await first.pull(f"{proxy.host}/hello:v1")
    finally:
        await first.close()
    await proxy.__aexit__(None, None, None)  # the registry is now unreachable
    second = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(proxy.host))
    try:
        assert second.image(hello_digest) == image
        assert second.layers() == {layer.digest: layer.size for layer in image.layers}
        again = await second.pull(f"{proxy.host}/hello:v1@{hello_digest}")
    finally:
        await second.close()
    assert again == image


@pytest.mark.parametrize(
    ("mode", "code"),
    [
        ("wrong_digest", "digest_mismatch"),
        ("truncate", "size_mismatch"),
        ("extra_bytes", "size_mismatch"),
    ],
)
async def test_corrupted_blob_is_rejected_and_nothing_lands_under_its_digest(
    tmp_path: Path,
    proxy: RegistryProxy,
    docker_registry: DockerRegistry,
    hello_digest: str,
    mode: str,
    code: str,
) -> None:
    layer = _layer_digest(docker_registry)
    proxy.tamper[layer] = mode
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(proxy.host))
    error = await refused_pull(cache, f"{proxy.host}/hello:v1")
    assert error.code == code
    blob_dir = tmp_path / "cache" / "blobs" / "sha256"
    assert not (blob_dir / layer.split(":")[1]).exists()
    assert [p.name for p in blob_dir.iterdir() if p.name.startswith(".tmp-")] == []
    assert cache.layers() == {}


async def test_bearer_challenge_is_answered_with_a_token_and_the_pull_succeeds(
    tmp_path: Path,
    docker_registry: DockerRegistry,
    hello_digest: str,
) -> None:
    async with RegistryProxy(docker_registry.url, require_token=True) as guarded:
        cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(guarded.host))
        try:
            image = await cache.pull(f"{guarded.host}/hello:v1")
        finally:
            await cache.close()
    assert image.digest == hello_digest
    assert guarded.unauthorized == 1  # one challenge; the token was reused for the blobs
    assert guarded.token_requests == [{"service": "thaw-test", "scope": "repository:hello:pull"}]


async def test_blob_redirects_are_followed(
    tmp_path: Path,
    docker_registry: DockerRegistry,
    hello_digest: str,
) -> None:
    async with RegistryProxy(docker_registry.url, redirect_blobs=True) as redirecting:
        policy = _listing(redirecting.host)
        cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=policy)
        try:
            image = await cache.pull(f"{redirecting.host}/hello:v1")
        finally:
            await cache.close()
    assert (Path(image.rootfs) / "app.py").is_file()


async def test_pinned_ref_whose_manifest_bytes_do_not_hash_to_the_pin_is_refused(
    tmp_path: Path, proxy: RegistryProxy, hello_digest: str
) -> None:
    proxy.tamper[hello_digest] = "wrong_digest"
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=_listing(proxy.host))
    error = await refused_pull(cache, f"{proxy.host}/hello:v1@{hello_digest}")
    assert error.code == "digest_mismatch"
    assert proxy.blob_gets == {}


async def test_hosts_outside_the_allow_list_are_refused_before_any_request(
    tmp_path: Path, proxy: RegistryProxy
) -> None:
    policy = EgressPolicy.build(["a.b"], listed_only=True)
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=policy)
    error = await refused_pull(cache, f"{proxy.host}/hello:v1")
    assert error.code == "forbidden_host"
    assert proxy.blob_gets == {}


async def test_unknown_repository_is_not_found(
    tmp_path: Path,
    docker_registry: DockerRegistry,
) -> None:
    policy = _listing(docker_registry.host)
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=policy)
    error = await refused_pull(cache, f"{docker_registry.host}/nothing-here:v1")
    assert error.code == "not_found"
    where = f"{docker_registry.host}: manifest nothing-here:v1"
    assert error.message == f"{where}: not found (HTTP 404)"


_PULL_SCRIPT = """
import asyncio, sys
from pathlib import Path
from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy

async def main():
    policy = EgressPolicy.build([sys.argv[2].split("/")[0]])
    cache = ImageCache(Path(sys.argv[1]), budget_bytes=1 << 30, policy=policy)
    await cache.pull(sys.argv[2])

asyncio.run(main())
"""


async def test_kill_9_mid_download_leaves_no_file_under_the_digest_name(
    tmp_path: Path,
    proxy: RegistryProxy,
    docker_registry: DockerRegistry,
    hello_digest: str,
) -> None:
    layer = _layer_digest(docker_registry)
    proxy.tamper[layer] = "stall"
    root = tmp_path / "cache"
    blob_dir = root / "blobs" / "sha256"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PULL_SCRIPT,
        str(root),
        f"{proxy.host}/hello:v1",
        cwd=str(REPO),
    )
    try:
        for _ in range(500):
            if blob_dir.is_dir() and any(p.name.startswith(".tmp-") for p in blob_dir.iterdir()):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the download never started")
        await asyncio.sleep(0.1)
    finally:
        process.kill()
        await process.wait()
    assert not (blob_dir / layer.split(":")[1]).exists()
    cache = ImageCache(root, budget_bytes=GIB)  # no pull: the default policy will do
    await cache.close()
    assert cache.layers() == {}
    assert [p.name for p in blob_dir.iterdir() if p.name.startswith(".tmp-")] == []
