"""App-owner and operator commands: apps, deploy, machines, status, tokens (placement's API).

The token sent is `--token`, else $THAW_TOKEN, else the local platform's admin token
(`./.thaw/admin.token`, written by `thaw up`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from thaw.appconfig import InvalidConfig, parse
from thaw.client import ApiClient, ApiError
from thaw.tables import table

MACHINE_COLUMNS = ["id", "state", "worker", "region", "address", "image_digest"]
LOCAL_TOKEN = Path(".thaw") / "admin.token"
DURATION = re.compile(r"^(\d+)([smhd]?)$")


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                        env: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--api", default=env("API_URL", "http://127.0.0.1:4280"),
                        metavar="[http://]HOST:PORT",
                        help="placement's API (default $THAW_API_URL or 127.0.0.1:4280)")
    common.add_argument("--token", default=env("TOKEN", ""),
                        help=f"bearer token (default $THAW_TOKEN, else ./{LOCAL_TOKEN})")

    apps = sub.add_parser("apps", help="create, list, show, update, delete apps")
    apps_sub = apps.add_subparsers(dest="action", required=True)
    create = apps_sub.add_parser("create", parents=[common], help="create an app")
    create.add_argument("name", help="the app's name (its host is NAME.DOMAIN)")
    create.add_argument("--image", required=True, help="the image to run, e.g. REGISTRY/NAME:TAG")
    create.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="any AppConfig field, e.g. --set concurrency.soft_limit=20")
    apps_sub.add_parser("list", parents=[common], help="the apps you can see")
    for action, what in (("show", "an app's whole config"), ("delete", "delete an app")):
        apps_sub.add_parser(action, parents=[common], help=what).add_argument("name")
    update = apps_sub.add_parser("update", parents=[common], help="change an app's fields")
    update.add_argument("name")
    update.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")

    deploy = sub.add_parser("deploy", parents=[common], help="create or update, then deploy")
    deploy.add_argument("-c", "--config", type=Path, default=Path("thaw.toml"))
    deploy.add_argument("--image", default="")

    machines = sub.add_parser("machines", help="list, start, stop, suspend, destroy machines")
    m_sub = machines.add_subparsers(dest="action", required=True)
    m_sub.add_parser("list", parents=[common], help="an app's machines").add_argument("app")
    for action in ("start", "stop", "suspend", "destroy"):
        p = m_sub.add_parser(action, parents=[common], help=f"{action} a machine")
        p.add_argument("app")
        p.add_argument("id")

    sub.add_parser("status", parents=[common], help="workers, apps and machines as tables")
    sub.add_parser("releases", parents=[common],
                   help="an app's releases, newest first").add_argument("app")
    rollback = sub.add_parser("rollback", parents=[common],
                              help="a new release made from an earlier one")
    rollback.add_argument("app")
    rollback.add_argument("version", type=int)
    sub.add_parser("events", parents=[common],
                   help="what the reconciler did to an app, and why").add_argument("app")

    tokens = sub.add_parser("tokens", help="create, list and revoke API tokens (admin)")
    t_sub = tokens.add_subparsers(dest="action", required=True)
    create_token = t_sub.add_parser("create", parents=[common],
                                    help="a new token; its secret is printed once")
    create_token.add_argument("--app", action="append", default=[], metavar="APP",
                              help="an app the token may act on (repeatable)")
    create_token.add_argument("--admin", action="store_true", help="a token that can do all")
    create_token.add_argument("--name", default="", help="a label shown in lists")
    create_token.add_argument("--expires-in", default="", metavar="DURATION",
                              help="e.g. 3600, 90m, 24h, 30d (default: never)")
    t_sub.add_parser("list", parents=[common], help="every token, never a secret")
    t_sub.add_parser("revoke", parents=[common], help="revoke a token by id").add_argument("id")


def token_from(given: str, api: str) -> str:
    """`--token`/THAW_TOKEN, else the local platform's admin token — only for an API on
    this host: a remote `--api` never receives it."""
    if given:
        return given
    if urlsplit(api).hostname not in ("127.0.0.1", "localhost", "::1"):
        return ""
    try:
        return LOCAL_TOKEN.read_text().strip()
    except OSError:
        return ""


def api_url(given: str) -> str:
    """`--api`: http://host:port, or host:port (http:// is assumed)."""
    if "://" not in given:
        given = "http://" + given
    parts = urlsplit(given)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"--api: expected host:port or http://host:port, not {given!r}")
    try:
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise ValueError(f"--api: expected host:port or http://host:port, not {given!r}") \
            from None
    return given


def run_client_command(args: argparse.Namespace) -> int:
    args.api = api_url(args.api)
    client = ApiClient(args.api, token_from(args.token, args.api))
    try:
        if args.command == "tokens":
            return _tokens(client, args)
        if args.command == "apps":
            return _apps(client, args)
        if args.command == "deploy":
            return _deploy(client, args)
        if args.command == "machines":
            return _machines(client, args)
        if args.command in ("releases", "rollback", "events"):
            return _releases(client, args)
        return _status(client)
    except InvalidConfig as exc:
        what = "invalid config" if args.command in ("apps", "deploy") else "invalid value"
        print(f"{what}: {exc.field}: {exc.reason}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"thaw {args.command}: {exc}", file=sys.stderr)
        if exc.status == 401:
            print(f"  (pass --token, set THAW_TOKEN, or run where ./{LOCAL_TOKEN} is)",
                  file=sys.stderr)
        return 1


def settings(pairs: list[str]) -> dict[str, Any]:
    """["concurrency.soft_limit=20", "auto_stop=stop"] -> nested dict (JSON values parsed)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise InvalidConfig(key, "expected FIELD=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _apps(client: ApiClient, args: argparse.Namespace) -> int:
    if args.action == "create":
        body = {"name": args.name, "image": args.image, **settings(args.set)}
        parse(body)  # fail early, naming the field
        _print(client.post("/v1/apps", body))
    elif args.action == "list":
        apps = client.get("/v1/apps")
        print(table(apps, ["name", "image", "min_machines_running", "max_machines", "auto_stop"]))
    elif args.action == "show":
        _print(client.get(f"/v1/apps/{args.name}"))
    elif args.action == "update":
        _print(client.patch(f"/v1/apps/{args.name}", settings(args.set)))
    else:
        client.delete(f"/v1/apps/{args.name}")
        print(f"deleted {args.name}")
    return 0


def load_thaw_toml(path: Path) -> dict[str, Any]:
    """thaw.toml: AppConfig fields at the top level; `app` is accepted for `name`."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"no {path} here (pass -c PATH, or write one: see docs/cli.md)") \
            from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    if "app" in data:
        data["name"] = data.pop("app")
    return data


def _deploy(client: ApiClient, args: argparse.Namespace) -> int:
    body = load_thaw_toml(args.config)
    if args.image:
        body["image"] = args.image
    config = parse(body)
    try:
        client.get(f"/v1/apps/{config.name}")
        client.patch(f"/v1/apps/{config.name}", body)
    except ApiError as exc:
        if exc.status != 404:
            raise
        client.post("/v1/apps", body)
    _print(client.post(f"/v1/apps/{config.name}/deploy", {}))
    return 0


def _machines(client: ApiClient, args: argparse.Namespace) -> int:
    base = f"/v1/apps/{args.app}/machines"
    if args.action == "list":
        print(table(client.get(base), MACHINE_COLUMNS))
    elif args.action == "destroy":
        client.delete(f"{base}/{args.id}")
        print(f"destroying {args.id}")
    else:
        _print(client.post(f"{base}/{args.id}/{args.action}"))
    return 0


def _releases(client: ApiClient, args: argparse.Namespace) -> int:
    base = f"/v1/apps/{args.app}"
    if args.command == "rollback":
        made = client.post(f"{base}/rollback", {"version": args.version})
        print(f"release {made['version']} of {args.app}: {made['image']} "
              f"(from release {args.version}), {made['status']}")
    elif args.command == "releases":
        rows = [{**r, "created": _when(r["created_at"])} for r in client.get(f"{base}/releases")]
        print(table(rows, ["version", "status", "image", "strategy", "created", "reason"]))
    else:
        rows = [{**e, "when": _when(e["at"])} for e in client.get(f"{base}/events")]
        print(table(rows, ["when", "action", "machine", "outcome", "reason"]))
    return 0


def _status(client: ApiClient) -> int:
    workers = client.get("/v1/workers")
    print("WORKERS")
    print(table(workers, ["id", "region", "url", "cpus", "reserved_cpus", "memory_mb",
                          "reserved_memory_mb", "machines_starting", "epoch"]))
    for app in client.get("/v1/apps"):
        print(f"\nAPP {app['name']}  image={app['image']}  "
              f"min={app['min_machines_running']} max={app['max_machines']}")
        print(table(client.get(f"/v1/apps/{app['name']}/machines"), MACHINE_COLUMNS))
    return 0


def seconds(text: str) -> int:
    found = DURATION.match(text.strip())
    if found is None:
        raise InvalidConfig("expires_in", f"{text!r} is not a duration like 3600, 90m, 24h, 30d")
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]
    return int(found.group(1)) * unit


def _tokens(client: ApiClient, args: argparse.Namespace) -> int:
    if args.action == "create":
        body: dict[str, Any] = {"name": args.name, "admin": args.admin, "apps": args.app}
        if args.expires_in:
            body["expires_in_s"] = seconds(args.expires_in)
        made = client.post("/v1/tokens", body)
        scope = "admin" if made["admin"] else "apps " + ",".join(made["apps"])
        print(f"token {made['id']} ({scope}); this is the only time it is shown:")
        print(made["token"])
    elif args.action == "list":
        rows = [{**t, "scope": "admin" if t["admin"] else ",".join(t["apps"]),
                 "created": _when(t["created_at"]), "expires": _when(t["expires_at"]),
                 "revoked": _when(t["revoked_at"])} for t in client.get("/v1/tokens")]
        print(table(rows, ["id", "name", "scope", "created", "expires", "revoked"]))
    else:
        client.delete(f"/v1/tokens/{args.id}")
        print(f"revoked {args.id}")
    return 0


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "-"
