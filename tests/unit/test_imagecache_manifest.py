"""Manifest, index and config parsing, including linux/amd64 selection."""

from __future__ import annotations

import json

import pytest

from imagecache.core.manifest import (
    DOCKER_LIST,
    OCI_INDEX,
    media_type_of,
    parse_config,
    parse_diff_ids,
    parse_manifest,
    select_platform,
    select_tag,
)
from imagecache.errors import ImageError


def _d(n: int) -> str:
    return "sha256:" + f"{n:064x}"


def _entry(n: int, os_name: str, arch: str, **extra: str) -> dict[str, object]:
    platform = {"os": os_name, "architecture": arch, **extra}
    return {"mediaType": "m", "digest": _d(n), "size": n, "platform": platform}


def test_index_selection_picks_linux_amd64_among_other_platforms() -> None:
    index = {
        "mediaType": OCI_INDEX,
        "manifests": [
            _entry(1, "linux", "arm64", variant="v8"),
            _entry(2, "windows", "amd64"),
            _entry(3, "linux", "amd64"),
            _entry(4, "linux", "arm"),
        ],
    }
    assert select_platform(index).digest == _d(3)


def test_docker_manifest_list_selection_picks_linux_amd64() -> None:
    manifest_list = {
        "mediaType": DOCKER_LIST,
        "manifests": [_entry(7, "linux", "s390x"), _entry(8, "linux", "amd64")],
    }
    assert media_type_of(manifest_list) == DOCKER_LIST
    assert select_platform(manifest_list).digest == _d(8)


def test_index_without_linux_amd64_is_not_found() -> None:
    index = {"manifests": [_entry(1, "linux", "arm64")]}
    with pytest.raises(ImageError) as caught:
        select_platform(index)
    assert caught.value.code == "not_found"


def test_media_type_falls_back_to_content_type_then_shape() -> None:
    assert media_type_of({"manifests": []}) == OCI_INDEX
    assert media_type_of({}, DOCKER_LIST + "; charset=utf-8") == DOCKER_LIST


def test_layout_index_tag_is_matched_on_ref_name_annotation() -> None:
    index = {
        "manifests": [
            {"digest": _d(1), "size": 1, "annotations": {"org.opencontainers.image.ref.name": "a"}},
            {"digest": _d(2), "size": 2, "annotations": {"org.opencontainers.image.ref.name": "b"}},
        ]
    }
    assert select_tag(index, "b").digest == _d(2)
    with pytest.raises(ImageError):
        select_tag(index, "latest")


def test_manifest_with_unknown_layer_type_is_unsupported() -> None:
    doc = {
        "config": {"digest": _d(1), "size": 1},
        "layers": [{"mediaType": "application/zstd-thing", "digest": _d(2), "size": 2}],
    }
    with pytest.raises(ImageError) as caught:
        parse_manifest(doc)
    assert caught.value.code == "unsupported"


def test_manifest_with_negative_layer_size_is_a_registry_error() -> None:
    doc = {"config": {"digest": _d(1), "size": 1}, "layers": [{"digest": _d(2), "size": -1}]}
    with pytest.raises(ImageError) as caught:
        parse_manifest(doc)
    assert caught.value.code == "registry_error"


def test_config_yields_entrypoint_cmd_env_workdir_and_ports() -> None:
    config = {
        "config": {
            "Entrypoint": ["python3", "app.py"],
            "Cmd": ["--x"],
            "Env": ["A=1"],
            "WorkingDir": "/app",
            "ExposedPorts": {"8080/tcp": {}},
        }
    }
    parsed = parse_config(json.dumps(config).encode())
    assert parsed.entrypoint == ["python3", "app.py"]
    assert (parsed.cmd, parsed.env, parsed.working_dir) == (["--x"], ["A=1"], "/app")
    assert parsed.exposed_ports == ["8080/tcp"]


def test_diff_ids_come_from_rootfs_one_per_layer() -> None:
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [_d(1), _d(2)]}}).encode()
    assert parse_diff_ids(config, 2) == [_d(1), _d(2)]


@pytest.mark.parametrize(
    ("rootfs", "code"),
    [
        (None, "registry_error"),
        ({"diff_ids": "sha256:x"}, "registry_error"),
        ({"diff_ids": ["md5:abc"]}, "registry_error"),
        ({"diff_ids": [_d(1)]}, "digest_mismatch"),
        ({"diff_ids": [_d(1), _d(2), _d(3)]}, "digest_mismatch"),
    ],
)
def test_missing_malformed_or_miscounted_diff_ids_refuse_the_image(
    rootfs: object, code: str
) -> None:
    config = json.dumps({"rootfs": rootfs}).encode()
    with pytest.raises(ImageError) as caught:
        parse_diff_ids(config, 2)
    assert caught.value.code == code
