"""Hand-made OCI image layouts and layer tarballs for image-cache tests."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Entry:
    """One tar member: kind is file|dir|symlink|hardlink|chr|fifo."""

    name: str
    kind: str = "file"
    data: bytes = b""
    linkname: str = ""
    mode: int = 0o644


_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "chr": tarfile.CHRTYPE,
    "fifo": tarfile.FIFOTYPE,
}


def layer_tar(entries: list[Entry], *, compress: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = _TYPES[entry.kind]
            info.mode = entry.mode
            info.linkname = entry.linkname
            info.size = len(entry.data) if entry.kind == "file" else 0
            archive.addfile(info, io.BytesIO(entry.data) if entry.kind == "file" else None)
    raw = buffer.getvalue()
    return gzip.compress(raw, mtime=0) if compress else raw


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put(layout: Path, data: bytes) -> dict[str, Any]:
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    digest = _digest(data)
    (blobs / digest.split(":", 1)[1]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def add_image(
    layout: Path, layers: list[bytes], *, entrypoint: list[str] | None = None
) -> dict[str, Any]:
    """Write config, layers and manifest blobs; return the manifest's descriptor."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint or ["/bin/true"]},
        "rootfs": {"type": "layers", "diff_ids": []},
    }
    config_desc = _put(layout, json.dumps(config).encode())
    layer_descs = []
    for data in layers:
        media = "application/vnd.oci.image.layer.v1.tar"
        if data[:2] == b"\x1f\x8b":
            media += "+gzip"
        layer_descs.append({"mediaType": media, **_put(layout, data)})
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": layer_descs,
    }
    return {"mediaType": OCI_MANIFEST, **_put(layout, json.dumps(manifest).encode())}


def add_index(layout: Path, platforms: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """Write an image index over (os, arch) -> manifest descriptor; return its descriptor."""
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {**desc, "platform": {"os": os_name, "architecture": arch}}
            for (os_name, arch), desc in platforms.items()
        ],
    }
    return {"mediaType": OCI_INDEX, **_put(layout, json.dumps(index).encode())}


def write_layout(layout: Path, tagged: dict[str, dict[str, Any]]) -> None:
    """Write oci-layout and index.json naming each descriptor by its tag."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    manifests = [{**desc, "annotations": {REF_NAME: tag}} for tag, desc in tagged.items()]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    (layout / "index.json").write_text(json.dumps(index))


def single_image_layout(layout: Path, layers: list[bytes], tag: str = "latest") -> str:
    """A layout holding one image under `tag`; returns the `oci:` reference."""
    write_layout(layout, {tag: add_image(layout, layers)})
    return f"oci:{layout}:{tag}"
