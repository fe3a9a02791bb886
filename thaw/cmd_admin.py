"""Operator commands: status (the platform, or one app, in a terminal's width) and
tokens."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from typing import TYPE_CHECKING, Any

from ground.appconfig import InvalidConfig
from thaw.client import ApiClient
from thaw.cmd_machines import machine_table
from thaw.cmdbase import GONE, client_of, url_of
from thaw.tables import emit, shorten, table, when

if TYPE_CHECKING:
    from thaw.cmdbase import Sub

DURATION = re.compile(r"^(\d+)([smhd]?)$")


def add(sub: Sub, common: argparse.ArgumentParser) -> None:
    status = sub.add_parser("status", parents=[common],
                            help="workers and apps at a glance, or one app and its machines")
    status.add_argument("app", nargs="?", default="", help="one app (default: all)")
    status.set_defaults(run=show_status)

    tokens = sub.add_parser("tokens", help="create, list and revoke API tokens (admin)")
    t = tokens.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = t.add_parser("create", parents=[common],
                          help="a new token; its secret is printed once")
    create.add_argument("--app", action="append", default=[], metavar="APP",
                        help="an app the token may act on (repeatable)")
    create.add_argument("--admin", action="store_true", help="a token that can do all")
    create.add_argument("--name", default="", help="a label shown in lists")
    create.add_argument("--expires-in", default="", metavar="DURATION",
                        help="e.g. 3600, 90m, 24h, 30d (default: never)")
    create.set_defaults(run=create_token)
    t.add_parser("list", parents=[common], help="every token, never a secret").set_defaults(
        run=list_tokens)
    revoke = t.add_parser("revoke", parents=[common], help="revoke a token by id")
    revoke.add_argument("id")
    revoke.set_defaults(run=revoke_token)


def show_status(args: argparse.Namespace) -> int:
    client = client_of(args)
    if args.app:
        return app_status(client, args)
    workers = client.get("/v1/workers")
    apps = [{"app": a, "machines": client.get(f"/v1/apps/{a['name']}/machines")}
            for a in client.get("/v1/apps")]
    emit(args.json, {"workers": workers, "apps": apps}, lambda: platform(workers, apps))
    return 0


def platform(workers: list[dict[str, Any]], apps: list[dict[str, Any]]) -> str:
    worker_rows = [{
        "id": w["id"], "region": w["region"], "state": worker_state(w),
        "cpus": f"{w['reserved_cpus']:g}/{w['cpus']:g}",
        "memory": f"{w['reserved_memory_mb']}/{w['memory_mb']} MiB",
        "machines": f"{w['machines_running']} running, {w['machines']} in all",
        "cache": f"{w['layer_bytes'] / 2**20:.0f} MiB",
    } for w in workers]
    app_rows = [{
        "name": a["app"]["name"], "release": a["app"]["release"],
        "scale": f"{a['app']['min_machines_running']}-{a['app']['max_machines']}",
        "machines": machine_counts(a["machines"]) or "none",
        "image": shorten(a["app"]["image"], 36),
    } for a in apps]
    return ("WORKERS\n" + table(worker_rows, ["id", "region", "state", "cpus", "memory",
                                              "machines", "cache"])
            + "\n\nAPPS\n" + table(app_rows, ["name", "release", "scale", "machines",
                                              "image"]))


def worker_state(w: dict[str, Any]) -> str:
    if w.get("failed"):
        return "failed"
    if w["draining"]:
        return "draining"
    if w.get("disk_full"):
        return "disk full"
    if w.get("pull_blocked"):
        return "cannot pull"
    return "healthy" if w["healthy"] else "stale"


def machine_counts(views: list[dict[str, Any]]) -> str:
    counts = Counter(v["state"] for v in views if v["state"] not in GONE)
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def app_status(client: ApiClient, args: argparse.Namespace) -> int:
    app = client.get(f"/v1/apps/{args.app}")
    views = client.get(f"/v1/apps/{args.app}/machines")
    url = url_of(args, app["name"])

    def human() -> str:
        head = (f"{app['name']}  release {app['release']}  {shorten(app['image'], 50)} "
                f"({str(app['image_digest'])[7:19]})\n"
                + (f"url {url}\n" if url else "")
                + f"scale {app['min_machines_running']}-{app['max_machines']}  "
                f"auto_stop {app['auto_stop']} after {app['idle_timeout_s']:g} s  "
                f"concurrency {app['concurrency']['soft_limit']}/"
                f"{app['concurrency']['hard_limit']} {app['concurrency']['type']}")
        return head + "\n\n" + machine_table(views)

    emit(args.json, {"app": app, "machines": views, "url": url}, human)
    return 0


def seconds(text: str) -> int:
    found = DURATION.match(text.strip())
    if found is None:
        raise InvalidConfig("expires_in", f"{text!r} is not a duration like 3600, 90m, 24h, 30d")
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]
    return int(found.group(1)) * unit


def create_token(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "admin": args.admin, "apps": args.app}
    if args.expires_in:
        body["expires_in_s"] = seconds(args.expires_in)
    made = client_of(args).post("/v1/tokens", body)
    scope = "admin" if made["admin"] else "apps " + ",".join(made["apps"])
    emit(args.json, made, f"token {made['id']} ({scope}); this is the only time it is "
                          f"shown:\n{made['token']}")
    return 0


def list_tokens(args: argparse.Namespace) -> int:
    tokens = client_of(args).get("/v1/tokens")
    rows = [{**t, "scope": "admin" if t["admin"] else ",".join(t["apps"]),
             "created": when(t["created_at"]), "expires": when(t["expires_at"]),
             "revoked": when(t["revoked_at"])} for t in tokens]
    emit(args.json, tokens, lambda: table(rows, ["id", "name", "scope", "created", "expires",
                                                 "revoked"]))
    return 0


def revoke_token(args: argparse.Namespace) -> int:
    revoked = client_of(args).delete(f"/v1/tokens/{args.id}")
    emit(args.json, revoked, f"revoked {args.id}")
    return 0
