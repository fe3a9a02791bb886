"""Image reference parsing: registry and OCI-layout forms."""

from __future__ import annotations

import pytest

from imagecache.core.reference import (
    LayoutRef,
    RegistryRef,
    is_loopback_host,
    parse_reference,
)
from imagecache.errors import ImageError

DIGEST = "sha256:" + "ab" * 32


def test_registry_ref_with_port_and_tag_splits_into_host_repository_tag() -> None:
    ref = parse_reference("127.0.0.1:5000/team/hello:v1")
    assert ref == RegistryRef(host="127.0.0.1:5000", repository="team/hello", tag="v1")
    assert isinstance(ref, RegistryRef)
    assert ref.base_url == "http://127.0.0.1:5000"
    assert ref.reference == "v1"


def test_missing_tag_defaults_to_latest() -> None:
    ref = parse_reference("localhost:5000/hello")
    assert isinstance(ref, RegistryRef) and ref.tag == "latest"


def test_digest_pinned_ref_fetches_by_digest() -> None:
    ref = parse_reference(f"localhost:5000/hello:v1@{DIGEST}")
    assert isinstance(ref, RegistryRef)
    assert (ref.tag, ref.digest, ref.reference) == ("v1", DIGEST, DIGEST)


def test_bare_name_maps_to_docker_hub_library() -> None:
    ref = parse_reference("alpine")
    assert ref == RegistryRef(
        host="registry-1.docker.io", repository="library/alpine", tag="latest"
    )
    assert isinstance(ref, RegistryRef) and ref.base_url.startswith("https://")


def test_user_repo_on_docker_hub_keeps_its_namespace() -> None:
    ref = parse_reference("someone/app:2")
    assert isinstance(ref, RegistryRef)
    assert (ref.host, ref.repository, ref.tag) == ("registry-1.docker.io", "someone/app", "2")


def test_only_loopback_hosts_use_plain_http() -> None:
    assert is_loopback_host("localhost:5000")
    assert is_loopback_host("127.3.4.5")
    assert is_loopback_host("[::1]:5000")
    assert not is_loopback_host("10.0.0.1:5000")
    assert not is_loopback_host("registry.example.com")
    ref = parse_reference("registry.example.com/app")
    assert isinstance(ref, RegistryRef) and ref.base_url == "https://registry.example.com"


def test_layout_ref_takes_path_and_optional_tag() -> None:
    assert parse_reference("oci:/srv/images:v2") == LayoutRef(path="/srv/images", tag="v2")
    assert parse_reference("oci:rel/dir") == LayoutRef(path="rel/dir", tag="latest")


@pytest.mark.parametrize(
    "text",
    ["", " alpine", "Host.com/UPPER", "localhost:5000/app@sha256:short", "oci:", "a/b:bad tag"],
)
def test_malformed_references_are_refused_as_bad_reference(text: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_reference(text)
    assert caught.value.code == "bad_reference"
