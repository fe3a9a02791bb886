"""Manifests, indexes and image configs: what an OCI or Docker schema-2 document means.

Pure: takes bytes already fetched and returns descriptors and decisions (which
platform entry of an index to follow, which layers to fetch, what to run).
It never fetches and never trusts a document's own claim about its digest;
the caller verifies bytes against the digest it asked for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from imagecache.api import ImageConfig, Layer
from imagecache.errors import ImageError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
MANIFEST_ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))

INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
GZIP_LAYERS = frozenset({OCI_LAYER_GZIP, DOCKER_LAYER_GZIP})
PLAIN_LAYERS = frozenset({OCI_LAYER_TAR, "application/vnd.docker.image.rootfs.diff.tar"})


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: dict[str, str]


@dataclass(frozen=True)
class Manifest:
    config: Descriptor
    layers: list[Layer]


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def load_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImageError("registry_error", f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ImageError("registry_error", f"{what} is not a JSON object")
    return doc


def media_type_of(doc: dict[str, Any], header_type: str = "") -> str:
    """The document's mediaType field, else the Content-Type it came with, else by shape."""
    declared = doc.get("mediaType")
    if isinstance(declared, str) and declared:
        return declared
    if header_type.split(";")[0].strip() in INDEX_TYPES | MANIFEST_TYPES:
        return header_type.split(";")[0].strip()
    return OCI_INDEX if "manifests" in doc else OCI_MANIFEST


def descriptor(raw: Any, what: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise ImageError("registry_error", f"{what}: descriptor is not an object")
    digest, size = raw.get("digest"), raw.get("size")
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise ImageError("registry_error", f"{what}: bad or unsupported digest {_short(digest)}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ImageError("registry_error", f"{what}: bad size {_short(size)}")
    annotations = raw.get("annotations") or {}
    return Descriptor(str(raw.get("mediaType", "")), digest, size, dict(annotations))


def select_platform(
    index: dict[str, Any], *, os: str = "linux", architecture: str = "amd64"
) -> Descriptor:
    """The index entry for os/architecture; raise not_found when there is none."""
    for raw in index.get("manifests") or []:
        platform = raw.get("platform") if isinstance(raw, dict) else None
        if not isinstance(platform, dict):
            continue
        if platform.get("os") == os and platform.get("architecture") == architecture:
            return descriptor(raw, "index entry")
    raise ImageError("not_found", f"image index has no {os}/{architecture} manifest")


REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


def select_tag(index: dict[str, Any], tag: str) -> Descriptor:
    """The layout index entry annotated `org.opencontainers.image.ref.name = tag`.

    A bare tag ("v1") also finds the one image named "NAME:v1" (`thaw image build`
    keeps each image's name in its layout); two such images make it ambiguous."""
    named: list[tuple[str, dict[str, Any]]] = []
    for raw in index.get("manifests") or []:
        notes = raw.get("annotations") if isinstance(raw, dict) else None
        ref_name = notes.get(REF_NAME_ANNOTATION) if isinstance(notes, dict) else None
        if ref_name == tag:
            return descriptor(raw, "layout index entry")
        if isinstance(ref_name, str) and ":" not in tag and ref_name.endswith(f":{tag}"):
            named.append((ref_name, raw))
    if len(named) == 1:
        return descriptor(named[0][1], "layout index entry")
    if named:
        names = ", ".join(sorted(n for n, _ in named))
        raise ImageError("not_found", f"tag {tag!r} is ambiguous in the layout ({names}): "
                                      "name one as oci:PATH:NAME:TAG")
    raise ImageError("not_found", f"no image tagged {tag!r} in the layout index")


def parse_manifest(doc: dict[str, Any]) -> Manifest:
    """An image manifest's config and layers; refuses layer types we cannot unpack."""
    config = descriptor(doc.get("config"), "manifest config")
    layers: list[Layer] = []
    for raw in doc.get("layers") or []:
        d = descriptor(raw, "manifest layer")
        if d.media_type not in GZIP_LAYERS | PLAIN_LAYERS:
            kind = _short(d.media_type)
            raise ImageError("unsupported", f"layer {d.digest} has media type {kind}")
        layers.append(Layer(digest=d.digest, size=d.size, media_type=d.media_type))
    return Manifest(config=config, layers=layers)


def parse_config(data: bytes) -> ImageConfig:
    """The runnable part of an image config blob (entrypoint, cmd, env, workdir, ports)."""
    doc = load_json(data, "image config")
    run = doc.get("config") or {}
    if not isinstance(run, dict):
        raise ImageError("registry_error", "image config 'config' is not an object")
    return ImageConfig(
        entrypoint=_strings(run.get("Entrypoint")),
        cmd=_strings(run.get("Cmd")),
        env=_strings(run.get("Env")),
        working_dir=str(run.get("WorkingDir") or ""),
        exposed_ports=sorted(str(p) for p in (run.get("ExposedPorts") or {})),
        user=str(run.get("User") or ""),
        stop_signal=str(run.get("StopSignal") or "")[:32],
    )


def parse_diff_ids(data: bytes, layer_count: int) -> list[str]:
    """The config's `rootfs.diff_ids`: the sha256 of each layer's uncompressed tar, in order.

    Refuses a config without them or with a count other than the manifest's
    layers: every layer is checked against its diff_id when it is unpacked.
    """
    doc = load_json(data, "image config")
    rootfs = doc.get("rootfs")
    ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(ids, list) or not all(_is_sha256(x) for x in ids):
        raise ImageError("registry_error", "image config has no valid rootfs.diff_ids")
    if len(ids) != layer_count:
        raise ImageError(
            "digest_mismatch", f"image config lists {len(ids)} diff_ids for {layer_count} layers"
        )
    return [str(x) for x in ids]


def _is_sha256(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 71
        and value.startswith("sha256:")
        and all(c in "0123456789abcdef" for c in value[7:])
    )


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImageError("registry_error", f"expected a list of strings, got {_short(value)}")
    return list(value)


def _short(value: Any) -> str:
    """A document's value for an error message, cut short: messages never carry bodies."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
