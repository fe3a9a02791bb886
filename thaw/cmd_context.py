"""`thaw context list|use|add|remove`: the platforms the CLI talks to, by name
(thaw/contexts.py). `thaw up` writes `local` itself."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from thaw import contexts
from thaw.appbuild import check_images
from thaw.cmdbase import api_url
from thaw.tables import emit, table

if TYPE_CHECKING:
    from thaw.cmdbase import Sub


def add(sub: Sub, common: argparse.ArgumentParser) -> None:
    context = sub.add_parser("context", help="the platforms the CLI talks to, by name")
    c = context.add_subparsers(dest="action", required=True, metavar="ACTION")
    listed = c.add_parser("list", help="every context; * marks the current one")
    listed.add_argument("--json", action="store_true", help="print them as JSON")
    listed.set_defaults(run=context_list)
    chosen = c.add_parser("use", help="make a context the current one")
    chosen.add_argument("name")
    chosen.set_defaults(run=context_use)
    added = c.add_parser("add", help="add (or replace) a context")
    added.add_argument("name")
    added.add_argument("--api", required=True, metavar="[http[s]://]HOST:PORT",
                       help="its placement API")
    added.add_argument("--token-file", default="", metavar="PATH",
                       help="the file its token is in (read at each command)")
    added.add_argument("--cacert", default="", metavar="PATH",
                       help="the CA (PEM) its API's certificate is checked against")
    added.add_argument("--app-url", default="", metavar="URL",
                       help="where it serves an app, {app} for the name, e.g. "
                            "'https://{app}.example.com/' (for thaw apps open)")
    added.add_argument("--images", default="", metavar="oci:DIR|URL",
                       help="where thaw deploy puts an image it builds ([build] in "
                            "thaw.toml): a layout the platform reads, oci:/DIR, or a "
                            "registry, http(s)://HOST:PORT")
    added.add_argument("--use", action="store_true", help="make it the current one too")
    added.set_defaults(run=context_add)
    removed = c.add_parser("remove", help="forget a context")
    removed.add_argument("name")
    removed.set_defaults(run=context_remove)


def context_list(args: argparse.Namespace) -> int:
    known = contexts.load()
    rows = [{"": "*" if name == known.current else "", "name": name, "api": c.api,
             "token file": c.token_file or "-", "ca": c.cacert or "-",
             "apps at": c.app_url or "-"}
            for name, c in sorted(known.contexts.items())]
    emit(args.json, msgspec.to_builtins(known),
         lambda: table(rows, ["", "name", "api", "apps at", "token file", "ca"]) if rows else
         f"no contexts yet in {contexts.config_dir() / contexts.FILE} (`thaw up` writes "
         "one, `thaw context add` adds one)")
    return 0


def context_use(args: argparse.Namespace) -> int:
    contexts.use(args.name)
    print(f"current context: {args.name}")
    return 0


def context_add(args: argparse.Namespace) -> int:
    files = [Path(p).resolve() for p in (args.token_file, args.cacert) if p]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise contexts.ContextError(f"no such file: {', '.join(missing)}")
    made = contexts.Context(
        api=api_url(args.api),
        token_file=str(Path(args.token_file).resolve()) if args.token_file else "",
        cacert=str(Path(args.cacert).resolve()) if args.cacert else "",
        app_url=contexts.check_app_url(args.app_url), images=check_images(args.images))
    now = contexts.put(args.name, made, use=args.use)
    print(f"context {args.name}: {made.api}"
          + (" (current)" if now.current == args.name else ""))
    return 0


def context_remove(args: argparse.Namespace) -> int:
    contexts.remove(args.name)
    print(f"removed context {args.name}")
    return 0
