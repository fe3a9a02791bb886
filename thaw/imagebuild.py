"""`thaw image build DIR -t NAME:TAG (--layout PATH | --push URL)`: a directory to an OCI image.

The image is a base (`from`: scratch, a built-in, an OCI layout or a registry
image; docs/images.md) with the app's layers on top, its blobs reused byte for
byte, and a config merged over the base's by Docker's rules
(thaw/imageconfig.py). The app is described by `DIR/Dockerfile` (or `-f FILE`,
a subset of Docker's; thaw/dockerplan.py) or else by `DIR/thaw-image.toml`.

With thaw-image.toml the app is one layer: DIR's files (less the toml,
`__pycache__`, `.git` and what `.dockerignore` lists) copied, as Docker's
`COPY . WORKDIR` would, into the WorkingDir (the toml's, else the base's, else
/app, which then becomes the WorkingDir). From `scratch` with no workdir the
files stay at the image's root, as before bases existed. Layers are
deterministic (sorted, mtime 0, owner 0:0): the same DIR makes the same digest.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tarfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from thaw.baseimage import BaseImageError
from thaw.dockerfile import DockerfileError, parse_dockerfile
from thaw.dockerignore import IgnoreRule, parse_dockerignore
from thaw.dockerplan import CopyStep, DockerfilePlan, HistoryStep, LayerPlan, plan_dockerfile
from thaw.imagebase import SCRATCH, BaseImage, file_in_image, load_base
from thaw.imageconfig import ConfigChanges, base_history, expose_entry, image_config_doc
from thaw.imagelayers import (
    BuildContext,
    CopyError,
    LayerEntry,
    Owner,
    copy_entries,
    directory_entry,
    owner_of,
)
from thaw.imagelayers import layer_tar as entries_tar
from thaw.ociimage import (  # noqa: F401 - OCI_MANIFEST, Blob, BuiltImage: the module's API
    OCI_MANIFEST,
    Blob,
    BuiltImage,
    gzip_layer,
    image_of,
    push_image,
    write_layout,
)

IMAGE_TOML = "thaw-image.toml"
DOCKERFILE = "Dockerfile"
DEFAULT_APP_DIR = "/app"
TOML_SETTINGS = frozenset({"from", "entrypoint", "cmd", "env", "workdir", "expose", "user",
                           "stop_signal", "labels"})
_TOML_HIDDEN = frozenset({"__pycache__", ".git"})


@dataclass(frozen=True)
class BuildOverrides:
    """Settings that win over thaw-image.toml or the Dockerfile; None / empty: not given."""

    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    expose: int | None = None
    user: str | None = None
    stop_signal: str | None = None
    base: str | None = None  # FROM (thaw-image.toml builds only)


class BuildError(ValueError):
    """A build refused: the message is what the owner sees after `thaw image build: `."""


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
    dockerfile: Path | None = None,
    build_args: dict[str, str] | None = None,
) -> str:
    """Build `src`, write it to `layout` and/or push it to `push`; return the manifest digest.

    Raises BuildError (and ValueError, OSError, RuntimeError for registry failures)."""
    name, tag = split_name_tag(name_tag)
    built = assemble(Path(src), overrides or BuildOverrides(), dockerfile, build_args or {})
    if layout is not None:
        write_layout(built, Path(layout), name, tag)
    if push is not None:
        push_image(built, push, name, tag)
    return built.manifest.digest


def assemble(src: Path, overrides: BuildOverrides, dockerfile: Path | None = None,
             build_args: dict[str, str] | None = None) -> BuiltImage:
    if dockerfile is None and (src / DOCKERFILE).is_file():
        dockerfile = src / DOCKERFILE
    bases = _Bases()
    if dockerfile is not None:
        if overrides.base is not None:
            raise BuildError("--from is for thaw-image.toml builds; a Dockerfile has FROM")
        shown = dockerfile.name if dockerfile == src / DOCKERFILE else str(dockerfile)
        plan = _dockerfile_plan(shown, dockerfile, build_args or {}, bases)
        context = BuildContext(src, _ignore_rules(src))
    else:
        shown = IMAGE_TOML
        plan = toml_plan(read_settings(src), overrides, bases)
        context = BuildContext(src, _ignore_rules(src), _toml_hidden)
    plan.changes = _overridden(plan.changes, overrides)
    return _image(bases(plan.base), plan, context, shown)


def _toml_hidden(rel: str) -> bool:
    return rel == IMAGE_TOML or any(part in _TOML_HIDDEN for part in rel.split("/"))


def _ignore_rules(src: Path) -> list[IgnoreRule]:
    ignore = src / ".dockerignore"
    return parse_dockerignore(ignore.read_text()) if ignore.is_file() else []


class _Bases:
    """The base of one build, loaded once (a Dockerfile's plan asks for its config first)."""

    def __init__(self) -> None:
        self._loaded: dict[str, BaseImage] = {}

    def __call__(self, ref: str) -> BaseImage:
        if ref not in self._loaded:
            try:
                self._loaded[ref] = load_base(ref)
            except BaseImageError as exc:
                raise BuildError(str(exc)) from None
        return self._loaded[ref]


def _dockerfile_plan(shown: str, dockerfile: Path, build_args: dict[str, str],
                     bases: _Bases) -> DockerfilePlan:
    try:
        plan = plan_dockerfile(parse_dockerfile(dockerfile.read_text()), build_args,
                               lambda ref: bases(ref).run_config)
    except DockerfileError as exc:
        where = f"{shown}:{exc.line}" if exc.line else shown
        raise BuildError(f"{where}: {exc.message}") from None
    if plan.unused_build_args:
        unused = ", ".join(plan.unused_build_args)
        print(f"thaw image build: warning: --build-arg {unused} not used by {shown}",
              file=sys.stderr)
    return plan


def read_settings(src: Path) -> dict[str, Any]:
    path = src / IMAGE_TOML
    if not path.is_file():
        return {}
    with open(path, "rb") as handle:
        settings = tomllib.load(handle)
    unknown = sorted(set(settings) - TOML_SETTINGS)
    if unknown:
        known = ", ".join(sorted(TOML_SETTINGS))
        raise BuildError(f"{IMAGE_TOML}: unknown setting {unknown[0]!r} (known: {known})")
    return settings


def toml_plan(settings: dict[str, Any], overrides: BuildOverrides,
              bases: Callable[[str], BaseImage]) -> DockerfilePlan:
    """thaw-image.toml as a plan: one layer copying the context into the app directory."""
    base_ref = overrides.base or str(settings.get("from") or SCRATCH)
    workdir = overrides.workdir or settings.get("workdir")
    if workdir is None and base_ref != SCRATCH:
        workdir = str(bases(base_ref).run_config.get("WorkingDir") or DEFAULT_APP_DIR)
    target = str(workdir) if workdir else "/"
    copy = CopyStep(0, ["."], target.rstrip("/") + "/", None, None, False)
    expose = settings.get("expose")
    changes = ConfigChanges(
        entrypoint=_argv(settings["entrypoint"]) if "entrypoint" in settings else None,
        cmd=_argv(settings["cmd"]) if "cmd" in settings else None,
        env=[(str(k), str(v)) for k, v in sorted((settings.get("env") or {}).items())],
        workdir=str(workdir) if workdir else None,
        user=str(settings["user"]) if "user" in settings else None,
        expose=[expose_entry(str(expose))] if expose else [],
        stop_signal=str(settings["stop_signal"]) if "stop_signal" in settings else None,
        labels={str(k): str(v) for k, v in (settings.get("labels") or {}).items()},
    )
    history = [HistoryStep(f"thaw image build: COPY . {target}", True)]
    return DockerfilePlan(base_ref, [LayerPlan([copy])], history, changes)


def _overridden(changes: ConfigChanges, overrides: BuildOverrides) -> ConfigChanges:
    """The command line's settings over the file's."""
    return replace(
        changes,
        entrypoint=overrides.entrypoint if overrides.entrypoint else changes.entrypoint,
        cmd=overrides.cmd if overrides.cmd else changes.cmd,
        env=[*changes.env, *sorted(overrides.env.items())],
        workdir=overrides.workdir or changes.workdir,
        expose=[expose_entry(str(overrides.expose))] if overrides.expose else changes.expose,
        user=overrides.user or changes.user,
        stop_signal=overrides.stop_signal or changes.stop_signal,
    )


def _argv(value: Any) -> list[str]:
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def _image(base: BaseImage, plan: DockerfilePlan, context: BuildContext,
           shown: str) -> BuiltImage:
    """The base's layers, one more per planned layer, and the merged config."""
    layers: list[Blob] = []
    diff_ids: list[str] = []
    for layer_plan in plan.layers:
        blob, diff_id = gzip_layer(entries_tar(_entries(layer_plan, context, base, shown)))
        layers.append(blob)
        diff_ids.append(diff_id)
    history = base_history(base.config_doc, len(base.layers), base.ref)
    history += [{"created_by": step.created_by, **({} if step.layer else {"empty_layer": True})}
                for step in plan.history]
    doc = image_config_doc(base.config_doc, plan.changes, [*base.diff_ids, *diff_ids], history)
    return image_of([*base.layers, *layers], doc)


def _entries(layer_plan: LayerPlan, context: BuildContext, base: BaseImage,
             shown: str) -> list[LayerEntry]:
    entries = [directory_entry(d) for d in layer_plan.dirs]
    for copy in layer_plan.copies:
        try:
            owner = _owner(copy.chown, base) if copy.chown else Owner()
            if copy.add:
                _refuse_archives(context, copy.sources)
            entries += copy_entries(context, copy.sources, copy.dest, owner=owner,
                                    mode=copy.chmod)
        except CopyError as exc:
            where = f"{shown}:{copy.line}" if copy.line else shown
            raise BuildError(f"{where}: {exc}") from None
    return entries


def _owner(spec: str, base: BaseImage) -> Owner:
    def table(path: str) -> str:
        data = file_in_image(base, path)
        return data.decode(errors="replace") if data is not None else ""

    return owner_of(spec, lambda: table("etc/passwd"), lambda: table("etc/group"))


def _refuse_archives(context: BuildContext, patterns: list[str]) -> None:
    """Docker's ADD would unpack a local archive: refused, rather than copied unpacked."""
    for pattern in patterns:
        for source in context.sources(pattern):
            path = context.root / source
            if path.is_file() and not path.is_symlink() and tarfile.is_tarfile(path):
                raise CopyError(f"ADD {source}: Docker would unpack this archive; thaw image "
                                "build does not: COPY it to copy it as a file")


def layer_tar(src: Path) -> bytes:
    """The uncompressed tar a thaw-image.toml build from scratch (no workdir) makes of `src`."""
    context = BuildContext(src, _ignore_rules(src), _toml_hidden)
    return entries_tar(copy_entries(context, ["."], "/"))


# ---- command line -------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thaw image", description="build OCI images: thaw image build DIR -t NAME:TAG ...")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build DIR into an OCI image")
    build.add_argument("dir", type=Path)
    build.add_argument("-t", "--tag", required=True, help="NAME[:TAG]")
    build.add_argument("-f", "--file", type=Path, help="the Dockerfile (default DIR/Dockerfile)")
    target = build.add_mutually_exclusive_group(required=True)
    target.add_argument("--layout", type=Path, help="OCI image layout directory to write")
    target.add_argument("--push", help="registry URL, e.g. http://127.0.0.1:5000")
    build.add_argument("--from", dest="base", metavar="REF",
                       help="base image: scratch, builtin:python3, builtin:busybox, "
                            "oci:PATH:TAG or HOST:PORT/NAME:TAG (thaw-image.toml builds)")
    build.add_argument("--build-arg", action="append", default=[], metavar="K=V")
    build.add_argument("--entrypoint", help="overrides the file's (shell-split)")
    build.add_argument("--cmd", help="overrides the file's (shell-split)")
    build.add_argument("--env", action="append", default=[], metavar="K=V")
    build.add_argument("--workdir")
    build.add_argument("--user")
    build.add_argument("--stop-signal")
    build.add_argument("--expose", type=int, metavar="PORT")
    return parser


def _pairs(flag: str, given: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for pair in given:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BuildError(f"{flag} wants K=V, got {pair!r}")
        found[key] = value
    return found


def image_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        overrides = BuildOverrides(
            entrypoint=shlex.split(args.entrypoint) if args.entrypoint else None,
            cmd=shlex.split(args.cmd) if args.cmd else None,
            env=_pairs("--env", args.env), workdir=args.workdir, expose=args.expose,
            user=args.user, stop_signal=args.stop_signal, base=args.base,
        )
        digest = build_image(
            args.dir, args.tag, layout=args.layout, push=args.push, overrides=overrides,
            dockerfile=args.file, build_args=_pairs("--build-arg", args.build_arg),
        )
    except (OSError, ValueError, RuntimeError, tomllib.TOMLDecodeError) as exc:
        print(f"thaw image build: {exc}", file=sys.stderr)
        return 1
    print(digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(image_main(sys.argv[1:]))
