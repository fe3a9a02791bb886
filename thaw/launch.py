"""`thaw launch`: write a commented thaw.toml from flags, or from questions at a terminal.

Every field is in the file: those given (and the required ones) as settings, the
rest commented out at their defaults, each with what it means and its bound
(thaw/appfields.py). The file is checked as `thaw deploy` would check it before it
is written, and an existing one is kept unless `--force`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ground.appconfig import APP_NAME, parse
from thaw.appbuild import CHECKED_AS, DOCKERFILE
from thaw.appfields import FieldDoc, fields, toml_value
from thaw.cmdbase import app_fields

# flag -> thaw.toml field (beyond --name and --image)
FLAGS = {
    "region": "regions", "port": "port", "min": "min_machines_running",
    "max": "max_machines", "soft_limit": "concurrency.soft_limit",
    "hard_limit": "concurrency.hard_limit", "auto_stop": "auto_stop",
    "idle_timeout": "idle_timeout_s", "cpus": "guest.cpus", "memory_mb": "guest.memory_mb",
    "health_path": "health.path",
}


def add_launch(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               common: argparse.ArgumentParser,
               deploy: Callable[[argparse.Namespace], int]) -> None:
    p = sub.add_parser("launch", parents=[common],
                       help="write a commented thaw.toml (asks what flags do not say)")
    p.add_argument("--name", default="", help="the app's name (default: asked, or this "
                                              "directory's name)")
    p.add_argument("--image", default="", help="the image to run, e.g. REGISTRY/NAME:TAG")
    p.add_argument("--region", default=None, help="the primary region")
    p.add_argument("--port", type=int, default=None, help="the port the app listens on")
    p.add_argument("--min", type=int, default=None, help="machines kept started")
    p.add_argument("--max", type=int, default=None, help="machines at most")
    p.add_argument("--soft-limit", type=int, default=None,
                   help="requests per machine before another is woken")
    p.add_argument("--hard-limit", type=int, default=None, help="requests per machine at most")
    p.add_argument("--auto-stop", choices=["off", "stop", "suspend"], default=None,
                   help="what an idle machine becomes")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="idle seconds before auto-stop")
    p.add_argument("--cpus", type=float, default=None, help="CPUs per machine")
    p.add_argument("--memory-mb", type=int, default=None, help="memory per machine, MiB")
    p.add_argument("--health-path", default=None, help="GET this path for readiness")
    p.add_argument("-c", "--config", type=Path, default=Path("thaw.toml"),
                   help="where to write (default ./thaw.toml)")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.add_argument("--deploy", action="store_true", help="deploy it once written")
    p.add_argument("-y", "--yes", action="store_true",
                   help="ask nothing: take defaults for what flags do not say")
    # --context as typed: thaw.toml names a context only when one was given here
    # ($THAW_CONTEXT still picks the platform for --deploy, never the file's line)
    p.set_defaults(run=lambda args: launch(args, deploy), context=None)


def launch(args: argparse.Namespace, deploy: Callable[[argparse.Namespace], int]) -> int:
    typed = args.context or ""
    if args.context is None:
        args.context = os.environ.get("THAW_CONTEXT", "")
    if args.config.exists() and not args.force:
        raise ValueError(f"{args.config} exists (pass --force to replace it)")
    ask = sys.stdin.isatty() and not args.yes
    here = args.config.resolve().parent
    # a Dockerfile beside thaw.toml and no --image: deploy builds it (thaw/appbuild.py)
    build = (here / DOCKERFILE).is_file() and not args.image
    values: dict[str, Any] = {
        "name": args.name or answer(ask, "App name", default_name(here.name)),
    }
    if not build:
        values["image"] = args.image or answer(ask, "Image (e.g. registry:5000/app:v1)", "")
        if not values["image"]:
            raise ValueError("--image is needed (no terminal to ask on)" if not ask
                             else "an image is needed")
    for flag, field in FLAGS.items():
        given = getattr(args, flag)
        if given is not None:
            values[field] = [given] if field == "regions" else given
    text = render(values, typed) + (BUILD_TABLE if build else "")
    checked = app_fields(tomllib.loads(text))  # what deploy will check, before it is written
    parse({"image": CHECKED_AS, **checked})
    args.config.write_text(text)
    if not args.json:
        print(f"wrote {args.config} for app {values['name']}"
              + ("" if args.deploy else f": thaw deploy -c {args.config}"))
        if build:
            print(f"found {DOCKERFILE}: thaw deploy builds it (thaw image build; RUN is not "
                  "supported yet, docs/images.md) and deploys the image it built, stored "
                  "where the context keeps images (thaw up's: its own layout)")
    if args.deploy:
        args.image, args.strategy, args.detach, args.wait_timeout = "", None, False, 300.0
        return deploy(args)
    return 0


BUILD_TABLE = f"""[build]
# thaw deploy builds this Dockerfile and deploys the image (docs/cli.md, thaw deploy)
dockerfile = "{DOCKERFILE}"
# dir = "."          # what COPY sees, from this file's directory
# args = {{}}          # --build-arg NAME = "value"
"""


def answer(ask: bool, question: str, default: str) -> str:
    if not ask:
        return default
    hint = f" [{default}]" if default else ""
    return input(f"{question}{hint}: ").strip() or default


def default_name(directory: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", directory.lower()).strip("-")[:63].strip("-")
    return name if APP_NAME.match(name) else ""


def render(values: dict[str, Any], context: str = "") -> str:
    """thaw.toml text: `values` (field path -> value) set, every other field commented
    out at its default; each line says what the field means and its bound; the platform
    (`context`) the CLI talks to from this directory when one was chosen."""
    lines = ["# thaw.toml: `thaw deploy` creates or updates this app and rolls it out.",
             "# Every field is here; a commented one is at its default. docs/cli.md",
             "# describes them all.", ""]
    lines += ["# the platform thaw commands here talk to (`thaw context list`); not the app's",
              f"context = {toml_value(context)}", ""] if context else []
    table = ""
    for field in fields():
        if field.table != table:
            table = field.table
            lines.append(f"[{table}]")
        lines += [line(field, values), ""]
    return "\n".join(lines) + "\n"


def line(field: FieldDoc, values: dict[str, Any]) -> str:
    key = "app" if field.path == "name" else field.key
    note = f"# {field.meaning}; {field.bound}"
    if field.path in values:
        return f"{note}\n{key} = {toml_value(values[field.path])}"
    if field.default is msgspec.NODEFAULT:  # the image, when deploy builds it
        return f"{note}\n# {key}: the one thaw deploy builds ([build], below)"
    return f"{note}\n# {key} = {toml_value(field.default)}"
