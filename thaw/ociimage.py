"""OCI images as bytes: blobs, the manifest that lists them, and where they are written.

An image is held in memory whole (its layers included): the images thaw builds
are an app's files over a base of tens of MB. `write_layout` adds one to an OCI
image layout directory; `push_image` uploads it through the Distribution API,
skipping the blobs the registry already has (a base's layers, after the first
push).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return sha256_of(self.data)

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}


@dataclass(frozen=True)
class BuiltImage:
    layers: list[Blob]  # bottom first
    config: Blob
    manifest: Blob

    @property
    def blobs(self) -> list[Blob]:
        """Every blob the manifest names, layers first."""
        return [*self.layers, self.config]


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(doc: dict[str, Any]) -> bytes:
    """JSON with sorted keys and no spaces: the same document always hashes the same."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def gzip_layer(tar_bytes: bytes) -> tuple[Blob, str]:
    """(the gzip layer blob, its diff_id); gzip's header mtime is 0 so the bytes repeat."""
    return Blob(OCI_LAYER_GZIP, gzip.compress(tar_bytes, mtime=0)), sha256_of(tar_bytes)


def image_of(layers: list[Blob], config_doc: dict[str, Any]) -> BuiltImage:
    config = Blob(OCI_CONFIG, canonical(config_doc))
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(),
        "layers": [layer.descriptor() for layer in layers],
    }
    return BuiltImage(layers, config, Blob(OCI_MANIFEST, canonical(manifest_doc)))


def layout_ref_name(name: str, tag: str) -> str:
    """The ref.name of an image in a layout: "greet:v1", so apps keep their own tags."""
    return f"{name}:{tag}" if name else tag


def write_layout(built: BuiltImage, layout: Path, name: str, tag: str) -> None:
    """Add the image to the OCI layout at `layout` as `name:tag`, replacing the image of
    that name and tag, and an image of a layout written before names were kept that
    holds the bare `tag` (what a build of that tag replaced then)."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    for blob in (*built.blobs, built.manifest):
        path = blobs / blob.digest.split(":", 1)[1]
        if not path.is_file() or path.stat().st_size != len(blob.data):
            _write_atomic(path, blob.data)
    index_path = layout / "index.json"
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    if index_path.is_file():
        index = json.loads(index_path.read_text())
    ref_name = layout_ref_name(name, tag)
    replaced = {ref_name, tag}
    kept = [m for m in index.get("manifests", [])
            if (m.get("annotations") or {}).get(REF_NAME) not in replaced]
    entry = built.manifest.descriptor() | {"annotations": {REF_NAME: ref_name}}
    index["manifests"] = [*kept, entry]
    _write_atomic(index_path, json.dumps(index, indent=2).encode())


def _write_atomic(path: Path, data: bytes) -> None:
    # unique per writer: two builds into one layout may write the same blob at once
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    temp.write_bytes(data)
    temp.replace(path)


def push_image(built: BuiltImage, url: str, name: str, tag: str) -> None:
    """Upload blobs (skipping those the registry has) and then the manifest under `tag`."""
    base = url.rstrip("/")
    for blob in built.blobs:
        if _request("HEAD", f"{base}/v2/{name}/blobs/{blob.digest}").status == 200:
            continue
        _upload_blob(base, name, blob)
    headers = {"Content-Type": OCI_MANIFEST}
    _request("PUT", f"{base}/v2/{name}/manifests/{tag}", built.manifest.data, headers)


def _upload_blob(base: str, name: str, blob: Blob) -> None:
    started = _request("POST", f"{base}/v2/{name}/blobs/uploads/")
    location = urllib.parse.urljoin(base + "/", started.headers["Location"])
    separator = "&" if "?" in location else "?"
    target = f"{location}{separator}digest={urllib.parse.quote(blob.digest)}"
    headers = {"Content-Type": "application/octet-stream"}
    _request("PUT", target, blob.data, headers)


class _Answer:
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers


def _request(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> _Answer:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return _Answer(response.status, dict(response.headers))
    except urllib.error.HTTPError as exc:
        if method == "HEAD" and exc.code == 404:
            return _Answer(404, {})
        detail = exc.read()[:500].decode(errors="replace")
        raise RuntimeError(f"{method} {url}: HTTP {exc.code} {detail}") from None
