"""An app built by `thaw deploy`, as `fly deploy` builds a Dockerfile: thaw.toml's `[build]`
names the Dockerfile (and the build's directory and arguments); deploy builds it with
`thaw image build`'s builder, stores the image where the context keeps images (an OCI
layout the platform reads, `oci:DIR`, or a registry, `http(s)://HOST:PORT`) under the
app's name and a tag made of its digest, and deploys that reference (pinned by digest as
every deploy is). `thaw up` writes its context with its own layout; `thaw context add
--images` sets one for another platform. `thaw launch` in a directory with a Dockerfile
writes the `[build]` table instead of asking for an image.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from thaw.imagebuild import BuildOverrides, assemble
from thaw.ociimage import push_image, write_layout

DOCKERFILE = "Dockerfile"
TAG_PREFIX = "deploy-"
LAYOUT = "oci:"
CHECKED_AS = "registry.invalid/app:build"  # the image thaw.toml is checked with before a build


class AppBuildError(ValueError):
    pass


class BuildSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """thaw.toml's `[build]`: paths are relative to the thaw.toml."""

    dockerfile: str = DOCKERFILE
    dir: str = "."  # the build's context: what COPY sees
    args: dict[str, str] = msgspec.field(default_factory=dict)  # --build-arg K=V


def read_build(path: Path) -> BuildSpec | None:
    """The `[build]` of the thaw.toml at `path` (None: it has none, or there is no file)."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f).get("build")
    except (OSError, tomllib.TOMLDecodeError):
        return None  # the command reading thaw.toml says what is wrong with it
    if table is None:
        return None
    try:
        return msgspec.convert(table, BuildSpec)
    except msgspec.ValidationError as exc:
        raise AppBuildError(f"{path}: [build]: {exc} (known: dockerfile, dir, args)") \
            from None


def check_images(target: str) -> str:
    """Where a context keeps built images: `oci:/ABSOLUTE/DIR`, `http(s)://HOST:PORT`, or
    "" (none)."""
    if not target:
        return target
    if target.startswith(LAYOUT):
        if not Path(target[len(LAYOUT):]).is_absolute():
            raise AppBuildError(f"--images: a layout is oci:/ABSOLUTE/DIR, not {target!r}")
        return target
    parts = urlsplit(target)
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/")
            or parts.username or parts.password or parts.query or parts.fragment):
        raise AppBuildError("--images: oci:/ABSOLUTE/DIR (a layout the platform reads) or "
                            f"http(s)://HOST:PORT (a registry), not {target[:200]!r}")
    return target


def within(base: Path, given: str, name: str) -> Path:
    """`given` from thaw.toml's directory, which it may not leave: a thaw.toml that came
    with a clone cannot pack the files beside or above it into an image."""
    path = (base / given).resolve()
    if path != base and base not in path.parents:
        raise AppBuildError(f"[build] {name} = {given!r} leaves {base} (thaw.toml's "
                            "directory): the build's files must be under it")
    return path


def build_and_store(spec: BuildSpec, toml: Path, app: str, images: str) -> str:
    """Build `spec` (its paths from `toml`'s directory), store it in `images` as
    APP:deploy-<digest>; the reference to deploy."""
    if not images:
        raise AppBuildError(
            f"{toml} has [build], but this context keeps no images: give it a place the "
            "platform reads them from (thaw context add NAME --api URL --images "
            "http(s)://REGISTRY:PORT|oci:/DIR --use), or deploy --image REF")
    base = toml.resolve().parent
    context, dockerfile = within(base, spec.dir, "dir"), within(base, spec.dockerfile,
                                                               "dockerfile")
    built = assemble(context, BuildOverrides(), dockerfile, dict(spec.args))
    tag = TAG_PREFIX + built.manifest.digest.split(":", 1)[1][:12]
    if images.startswith(LAYOUT):
        layout = images[len(LAYOUT):]
        write_layout(built, Path(layout), app, tag)
        return f"oci:{layout}:{app}:{tag}"
    push_image(built, images, app, tag)
    parts = urlsplit(images)
    return f"{parts.hostname}{f':{parts.port}' if parts.port else ''}/{app}:{tag}"
