"""Images in one OCI layout keep their names: `-t greet:v1` is found as greet:v1 and as v1."""

from __future__ import annotations

from typing import Any

import pytest

from imagecache.core.manifest import select_tag
from imagecache.core.reference import LayoutRef, parse_reference
from imagecache.errors import ImageError

REF = "org.opencontainers.image.ref.name"
DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def index(*entries: tuple[str, str]) -> dict[str, Any]:
    return {"manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": digest, "size": 1, "annotations": {REF: name}}
                          for name, digest in entries]}


def test_oci_path_name_tag_names_an_image_in_a_layout() -> None:
    assert parse_reference("oci:/srv/layout:greet:v1") == LayoutRef("/srv/layout", "greet:v1")
    assert parse_reference("oci:/srv/layout:team/greet:v1") == LayoutRef(
        "/srv/layout", "team/greet:v1")
    assert str(parse_reference("oci:/srv/layout:greet:v1")) == "oci:/srv/layout:greet:v1"


def test_oci_path_tag_still_parses_as_before() -> None:
    assert parse_reference("oci:/srv/layout:v1") == LayoutRef("/srv/layout", "v1")
    assert parse_reference("oci:/srv/layout") == LayoutRef("/srv/layout", "latest")
    assert parse_reference("oci:/srv/My:Layout:v1") == LayoutRef("/srv/My:Layout", "v1")


def test_a_named_image_is_found_by_name_and_tag() -> None:
    found = select_tag(index(("hello:v1", OTHER), ("greet:v1", DIGEST)), "greet:v1")
    assert found.digest == DIGEST


def test_a_bare_tag_finds_an_old_layouts_image_and_the_one_named_image_with_it() -> None:
    assert select_tag(index(("v1", DIGEST)), "v1").digest == DIGEST
    assert select_tag(index(("greet:v1", DIGEST), ("greet:v2", OTHER)), "v1").digest == DIGEST


def test_a_bare_tag_two_named_images_share_is_ambiguous() -> None:
    with pytest.raises(ImageError, match="ambiguous"):
        select_tag(index(("hello:v1", OTHER), ("greet:v1", DIGEST)), "v1")
