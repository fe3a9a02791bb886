"""ImageResolver: manifest-only resolution for placement, and the layout-directory rule."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.errors import ImageError
from imagecache.resolver import ImageResolver, ResolvedImage
from tests.support import docker_registry as registry_support
from tests.support.docker_registry import DockerRegistry
from tests.support.image_pulls import refused_pull
from tests.support.oci_layout import Entry, add_image, add_index, layer_tar, write_layout
from tests.support.registry_proxy import RegistryProxy
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = pytest.mark.integration
docker_registry = registry_support.docker_registry  # the session fixture, by name

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
# examples/hello without its python base: these tests are about the cache's pulls
SCRATCH = BuildOverrides(base="scratch")
GIB = 1024**3


@pytest.fixture(scope="module")
def hello_digest(docker_registry: DockerRegistry) -> str:
    return build_image(HELLO, "hello:v1", push=docker_registry.url, overrides=SCRATCH)


async def _resolve(policy: EgressPolicy, ref: str, **kwargs: float) -> ResolvedImage:
    resolver = ImageResolver(policy, **kwargs)
    try:
        return await resolver.resolve(ref)
    finally:
        await resolver.close()


async def _pull_error(policy: EgressPolicy, ref: str, root: Path) -> ImageError:
    return await refused_pull(ImageCache(root, budget_bytes=GIB, policy=policy), ref)


async def test_resolving_on_the_registry_gives_the_digest_and_layers_a_full_pull_gets(
    tmp_path: Path, docker_registry: DockerRegistry, hello_digest: str
) -> None:
    policy = EgressPolicy.build([docker_registry.host], listed_only=True)
    ref = f"{docker_registry.host}/hello:v1"
    resolved = await _resolve(policy, ref)
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=policy)
    try:
        image = await cache.pull(ref)
    finally:
        await cache.close()
    assert resolved == ResolvedImage(ref=ref, digest=image.digest, layers=image.layers,
                                     config=image.config)
    assert resolved.digest == hello_digest


async def test_resolving_fetches_manifests_and_the_config_but_no_layer(
    docker_registry: DockerRegistry, hello_digest: str
) -> None:
    async with RegistryProxy(docker_registry.url, require_token=True) as guarded:
        policy = EgressPolicy.build([guarded.host])
        resolved = await _resolve(policy, f"{guarded.host}/hello:v1")
    assert resolved.digest == hello_digest
    assert resolved.config.entrypoint == ["python3", "app.py"]  # what it runs, known at once
    layers = {layer.digest for layer in resolved.layers}
    assert set(guarded.blob_gets) and not set(guarded.blob_gets) & layers  # the config only
    assert guarded.token_requests == [{"service": "thaw-test", "scope": "repository:hello:pull"}]


async def test_resolving_a_layout_index_pins_the_linux_amd64_manifest(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    arm = add_image(layout, [layer_tar([Entry("arch", data=b"arm64")])])
    amd = add_image(layout, [layer_tar([Entry("arch", data=b"amd64")])])
    index = add_index(layout, {("linux", "arm64"): arm, ("linux", "amd64"): amd})
    write_layout(layout, {"multi": index})
    policy = EgressPolicy.build(layout_dirs=[str(tmp_path)])
    resolved = await _resolve(policy, f"oci:{layout}:multi")
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=policy)
    try:
        image = await cache.pull(f"oci:{layout}:multi")
    finally:
        await cache.close()
    assert resolved.digest == amd["digest"] == image.digest
    assert resolved.layers == image.layers


@pytest.fixture
async def stalled(docker_registry: DockerRegistry) -> AsyncIterator[RegistryProxy]:
    async with RegistryProxy(docker_registry.url) as proxy:
        proxy.tamper["v1"] = "stall"  # the manifest by tag: half a body, then nothing
        yield proxy


async def test_resolving_is_bounded_by_the_resolve_timeout(
    stalled: RegistryProxy, hello_digest: str
) -> None:
    ref = f"{stalled.host}/hello:v1"
    with pytest.raises(ImageError) as caught:
        await _resolve(EgressPolicy.build([stalled.host]), ref, resolve_timeout_s=0.3)
    assert caught.value.code == "registry_error"
    assert caught.value.message == f"{ref}: not resolved within 0.3 s"


async def test_bad_reference_is_refused_before_any_egress_check() -> None:
    with pytest.raises(ImageError) as caught:
        await _resolve(EgressPolicy(), "Not A Reference")
    assert caught.value.code == "bad_reference"


def _layout(tmp_path: Path, name: str) -> Path:
    layout = tmp_path / name
    write_layout(layout, {"v1": add_image(layout, [layer_tar([Entry("f", data=b"x")])])})
    return layout


async def test_layout_outside_the_allowed_dirs_is_refused_for_pull_and_resolve(
    tmp_path: Path,
) -> None:
    layout = _layout(tmp_path, "outside")
    policy = EgressPolicy.build(layout_dirs=[str(tmp_path / "allowed")])
    (tmp_path / "allowed").mkdir()
    ref = f"oci:{layout}:v1"
    with pytest.raises(ImageError) as caught:
        await _resolve(policy, ref)
    assert caught.value.code == "forbidden_host"
    error = await _pull_error(policy, ref, tmp_path / "cache")
    assert error.code == "forbidden_host"
    assert error.message == (f"layout {layout}: the layout is not under an allowed layout "
                             "directory; an operator allows a directory with --allow-layout "
                             "DIR (thaw up, or thaw placement and thaw agent)")


async def test_symlink_in_an_allowed_dir_to_a_layout_outside_is_refused(tmp_path: Path) -> None:
    outside = _layout(tmp_path, "outside")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "app").symlink_to(outside)
    policy = EgressPolicy.build(layout_dirs=[str(allowed)])
    error = await _pull_error(policy, f"oci:{allowed / 'app'}:v1", tmp_path / "cache")
    assert error.code == "forbidden_host"
    assert str(outside) not in error.message


async def test_relative_climb_out_of_an_allowed_dir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _layout(tmp_path, "outside")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    monkeypatch.chdir(allowed)
    policy = EgressPolicy.build(layout_dirs=[str(allowed)])
    error = await _pull_error(policy, "oci:../outside:v1", tmp_path / "cache")
    assert error.code == "forbidden_host"


async def test_blob_symlinked_out_of_an_allowed_layout_is_refused(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    layout = _layout(allowed, "app")
    index = (layout / "index.json").read_text()
    manifest_hex = index.split('"sha256:')[1].split('"')[0]
    secret = tmp_path / "secret"
    os.rename(layout / "blobs" / "sha256" / manifest_hex, secret)
    (layout / "blobs" / "sha256" / manifest_hex).symlink_to(secret)
    policy = EgressPolicy.build(layout_dirs=[str(allowed)])
    error = await _pull_error(policy, f"oci:{layout}:v1", tmp_path / "cache")
    assert error.code == "forbidden_host"
    assert str(secret) not in error.message


async def test_an_allowed_dir_named_through_a_symlink_allows_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real"
    layout = _layout(real, "app")
    (tmp_path / "alias").symlink_to(real)
    policy = EgressPolicy.build(layout_dirs=[str(tmp_path / "alias")])
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB, policy=policy)
    try:
        image = await cache.pull(f"oci:{tmp_path / 'alias' / 'app'}:v1")
    finally:
        await cache.close()
    assert (Path(image.rootfs) / "f").read_bytes() == b"x"
    assert (await _resolve(policy, f"oci:{layout}:v1")).digest == image.digest
