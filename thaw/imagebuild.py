"""`thaw image build DIR -t NAME:TAG (--layout PATH | --push URL)`: a directory to an OCI image.

The image has one deterministic gzip tar layer of DIR (sorted entries, mtime 0,
uid/gid 0, `thaw-image.toml` and `__pycache__` left out), a config built from
`DIR/thaw-image.toml` plus command-line overrides, and an OCI manifest. It is
written into an OCI image layout or pushed through the Distribution API.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import shlex
import sys
import tarfile
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_TOML = "thaw-image.toml"
_EXCLUDED_DIRS = frozenset({"__pycache__", ".git"})


@dataclass(frozen=True)
class BuildOverrides:
    """Settings that win over thaw-image.toml; None / empty means "not given"."""

    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    expose: int | None = None


@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}


@dataclass(frozen=True)
class BuiltImage:
    layer: Blob
    config: Blob
    manifest: Blob


def split_name_tag(name_tag: str) -> tuple[str, str]:
    """"team/app:v1" -> ("team/app", "v1"); no tag means "latest"."""
    name, tag = name_tag, "latest"
    if ":" in name_tag.rsplit("/", 1)[-1]:
        name, tag = name_tag.rsplit(":", 1)
    if not name or not tag:
        raise ValueError(f"bad image name {name_tag!r}; expected NAME[:TAG]")
    return name, tag


def build_image(
    src: Path,
    name_tag: str,
    *,
    layout: Path | None = None,
    push: str | None = None,
    overrides: BuildOverrides | None = None,
) -> str:
    """Build `src`, write it to `layout` and/or push it to `push`; return the manifest digest."""
    name, tag = split_name_tag(name_tag)
    built = assemble(Path(src), overrides or BuildOverrides())
    if layout is not None:
        write_layout(built, Path(layout), tag)
    if push is not None:
        push_image(built, push, name, tag)
    return built.manifest.digest


def assemble(src: Path, overrides: BuildOverrides) -> BuiltImage:
    tar_bytes = layer_tar(src)
    layer = Blob(OCI_LAYER_GZIP, gzip.compress(tar_bytes, mtime=0))
    diff_id = "sha256:" + hashlib.sha256(tar_bytes).hexdigest()
    settings = read_settings(src)
    config_doc = {
        "architecture": "amd64",
        "os": "linux",
        "config": run_config(settings, overrides),
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config = Blob(OCI_CONFIG, _canonical(config_doc))
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(),
        "layers": [layer.descriptor()],
    }
    return BuiltImage(layer, config, Blob(OCI_MANIFEST, _canonical(manifest_doc)))


def read_settings(src: Path) -> dict[str, Any]:
    path = src / IMAGE_TOML
    if not path.is_file():
        return {}
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def run_config(settings: dict[str, Any], overrides: BuildOverrides) -> dict[str, Any]:
    entrypoint = overrides.entrypoint or _argv(settings.get("entrypoint"))
    cmd = overrides.cmd or _argv(settings.get("cmd"))
    env = {str(k): str(v) for k, v in (settings.get("env") or {}).items()} | overrides.env
    workdir = overrides.workdir or str(settings.get("workdir") or "")
    expose = overrides.expose or settings.get("expose")
    config: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in sorted(env.items())]}
    if entrypoint:
        config["Entrypoint"] = entrypoint
    if cmd:
        config["Cmd"] = cmd
    if workdir:
        config["WorkingDir"] = workdir
    if expose:
        config["ExposedPorts"] = {f"{int(expose)}/tcp": {}}
    return config


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def layer_tar(src: Path) -> bytes:
    """The uncompressed, deterministic tar of `src` (the diff_id is its sha256)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in _walk(src):
            archive.addfile(*_entry(src, path))
    return buffer.getvalue()


def _walk(src: Path, directory: Path | None = None) -> list[Path]:
    found: list[Path] = []
    for path in sorted((directory or src).iterdir()):
        if path.name in _EXCLUDED_DIRS or (directory is None and path.name == IMAGE_TOML):
            continue
        found.append(path)
        if path.is_dir() and not path.is_symlink():
            found.extend(_walk(src, path))
    return found


def _entry(src: Path, path: Path) -> tuple[tarfile.TarInfo, io.BytesIO | None]:
    info = tarfile.TarInfo(path.relative_to(src).as_posix())
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if path.is_symlink():
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, str(path.readlink()), 0o777
        return info, None
    if path.is_dir():
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        return info, None
    data = path.read_bytes()
    info.size = len(data)
    info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
    return info, io.BytesIO(data)


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


# ---- outputs ------------------------------------------------------------------


def write_layout(built: BuiltImage, layout: Path, tag: str) -> None:
    """Add the image to the OCI layout at `layout`, replacing any image with the same tag."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    for blob in (built.layer, built.config, built.manifest):
        (blobs / blob.digest.split(":", 1)[1]).write_bytes(blob.data)
    index_path = layout / "index.json"
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    if index_path.is_file():
        index = json.loads(index_path.read_text())
    kept = [
        m for m in index.get("manifests", []) if (m.get("annotations") or {}).get(REF_NAME) != tag
    ]
    entry = built.manifest.descriptor() | {"annotations": {REF_NAME: tag}}
    index["manifests"] = [*kept, entry]
    temp = index_path.with_name(".index.json.tmp")
    temp.write_text(json.dumps(index, indent=2))
    temp.replace(index_path)


def push_image(built: BuiltImage, url: str, name: str, tag: str) -> None:
    """Upload blobs (skipping those the registry has) and then the manifest under `tag`."""
    base = url.rstrip("/")
    for blob in (built.layer, built.config):
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


# ---- command line -------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thaw image", description="build OCI images: thaw image build DIR -t NAME:TAG ...")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build DIR into an OCI image")
    build.add_argument("dir", type=Path)
    build.add_argument("-t", "--tag", required=True, help="NAME[:TAG]")
    target = build.add_mutually_exclusive_group(required=True)
    target.add_argument("--layout", type=Path, help="OCI image layout directory to write")
    target.add_argument("--push", help="registry URL, e.g. http://127.0.0.1:5000")
    build.add_argument("--entrypoint", help="overrides thaw-image.toml (shell-split)")
    build.add_argument("--cmd", help="overrides thaw-image.toml (shell-split)")
    build.add_argument("--env", action="append", default=[], metavar="K=V")
    build.add_argument("--workdir")
    build.add_argument("--expose", type=int, metavar="PORT")
    return parser


def image_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    env: dict[str, str] = {}
    for pair in args.env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            print(f"thaw image build: --env wants K=V, got {pair!r}", file=sys.stderr)
            return 2
        env[key] = value
    overrides = BuildOverrides(
        entrypoint=shlex.split(args.entrypoint) if args.entrypoint else None,
        cmd=shlex.split(args.cmd) if args.cmd else None,
        env=env,
        workdir=args.workdir,
        expose=args.expose,
    )
    try:
        digest = build_image(
            args.dir, args.tag, layout=args.layout, push=args.push, overrides=overrides
        )
    except (OSError, ValueError, RuntimeError, tomllib.TOMLDecodeError) as exc:
        print(f"thaw image build: {exc}", file=sys.stderr)
        return 1
    print(digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(image_main(sys.argv[1:]))
