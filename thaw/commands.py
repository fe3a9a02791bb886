"""App-owner and operator commands: apps, deploy, machines, status (placement's API)."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from thaw.appconfig import InvalidConfig, parse
from thaw.client import ApiClient, ApiError
from thaw.tables import table

MACHINE_COLUMNS = ["id", "state", "worker", "region", "address", "image_digest"]


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                        env: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--api", default=env("API_URL", "http://127.0.0.1:4280"))
    common.add_argument("--token", default=env("TOKEN", ""))

    apps = sub.add_parser("apps", help="create, list, show, update, delete apps")
    apps_sub = apps.add_subparsers(dest="action", required=True)
    create = apps_sub.add_parser("create", parents=[common])
    create.add_argument("name")
    create.add_argument("--image", required=True)
    create.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="any AppConfig field, e.g. --set concurrency.soft_limit=20")
    apps_sub.add_parser("list", parents=[common])
    for action in ("show", "delete"):
        apps_sub.add_parser(action, parents=[common]).add_argument("name")
    update = apps_sub.add_parser("update", parents=[common])
    update.add_argument("name")
    update.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")

    deploy = sub.add_parser("deploy", parents=[common], help="create or update, then deploy")
    deploy.add_argument("-c", "--config", type=Path, default=Path("thaw.toml"))
    deploy.add_argument("--image", default="")

    machines = sub.add_parser("machines", help="list, start, stop, suspend, destroy machines")
    m_sub = machines.add_subparsers(dest="action", required=True)
    m_sub.add_parser("list", parents=[common]).add_argument("app")
    for action in ("start", "stop", "suspend", "destroy"):
        p = m_sub.add_parser(action, parents=[common])
        p.add_argument("app")
        p.add_argument("id")

    sub.add_parser("status", parents=[common], help="workers, apps and machines as tables")


def run_client_command(args: argparse.Namespace) -> int:
    client = ApiClient(args.api, args.token)
    try:
        if args.command == "apps":
            return _apps(client, args)
        if args.command == "deploy":
            return _deploy(client, args)
        if args.command == "machines":
            return _machines(client, args)
        return _status(client)
    except InvalidConfig as exc:
        print(f"invalid config: {exc.field}: {exc.reason}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"thaw {args.command}: {exc}", file=sys.stderr)
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
    with open(path, "rb") as f:
        data = tomllib.load(f)
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
