"""Commands on an app's secrets: set, list, unset. Values go to placement only (encrypted
there); they are never printed, and `NAME=-` reads one from stdin, so it need not be on
the command line (shell history, `ps`)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any, TextIO

from ground.appconfig import ENV_NAME_PATTERN, InvalidConfig
from thaw.cmdbase import client_of
from thaw.tables import emit, table, when

if TYPE_CHECKING:
    from thaw.cmdbase import Sub

ENV_NAME = re.compile(ENV_NAME_PATTERN)
FROM_STDIN = "-"


def add(sub: Sub, common: argparse.ArgumentParser) -> None:
    secrets = sub.add_parser("secrets", help="set, list, unset an app's secrets (values "
                                             "encrypted, never shown)")
    s = secrets.add_subparsers(dest="action", required=True, metavar="ACTION")
    put = s.add_parser("set", parents=[common],
                       help="set secrets (one new release; machines roll)")
    put.add_argument("app")
    put.add_argument("pairs", nargs="+", metavar="NAME=VALUE",
                     help="NAME=- reads the value from stdin (one trailing newline dropped)")
    put.set_defaults(run=secrets_set)
    listed = s.add_parser("list", parents=[common], help="names and digests, never values")
    listed.add_argument("app")
    listed.set_defaults(run=secrets_list)
    unset = s.add_parser("unset", parents=[common],
                         help="remove secrets (one new release; machines roll)")
    unset.add_argument("app")
    unset.add_argument("names", nargs="+", metavar="NAME", help="the secrets to remove")
    unset.set_defaults(run=secrets_unset)


def secret_pairs(pairs: list[str], stdin: TextIO) -> dict[str, str]:
    """NAME=VALUE arguments as a dict; NAME=- takes stdin (once). InvalidConfig naming
    the argument's name, never echoing a value."""
    out: dict[str, str] = {}
    read_stdin = False
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not ENV_NAME.match(name):
            raise InvalidConfig(name[:128] or "NAME", "expected NAME=VALUE, NAME an env "
                                                      "variable name")
        if name in out:
            raise InvalidConfig(name, "given twice")
        if value == FROM_STDIN:
            if read_stdin:
                raise InvalidConfig(name, "only one value can come from stdin")
            read_stdin, value = True, stdin.read()
            value = value[:-1] if value.endswith("\n") else value
        out[name] = value
    return out


def secrets_set(args: argparse.Namespace) -> int:
    values = secret_pairs(args.pairs, sys.stdin)
    changed = client_of(args).post(f"/v1/apps/{args.app}/secrets", {"secrets": values})
    emit(args.json, changed, lambda: outcome(changed, "set", sorted(values)))
    return 0


def secrets_unset(args: argparse.Namespace) -> int:
    changed = client_of(args).post(f"/v1/apps/{args.app}/secrets", {"unset": args.names})
    emit(args.json, changed, lambda: outcome(changed, "unset", args.names))
    return 0


def secrets_list(args: argparse.Namespace) -> int:
    listed = client_of(args).get(f"/v1/apps/{args.app}/secrets")
    rows = [{**s, "set": when(s["created_at"])} for s in listed]
    emit(args.json, listed, lambda: table(rows, ["name", "digest", "set"])
         if rows else f"{args.app} has no secrets")
    return 0


def outcome(changed: dict[str, Any], verb: str, names: list[str]) -> str:
    release = changed.get("release")
    if release is None:
        return f"{changed['app']}: nothing changed (the values were already so)"
    return (f"{verb} {', '.join(names)} on {changed['app']}: release {release} "
            f"(machines roll; `thaw releases {changed['app']}` follows it)")
