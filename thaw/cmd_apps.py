"""Commands on apps: apps, launch, deploy (with the rollout's progress), scale,
releases, rollback, events."""

from __future__ import annotations

import argparse
import os
import shlex
import time
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ground.appconfig import APP_NAME, STRATEGIES, AppConfig, InvalidConfig, parse
from thaw import contexts
from thaw.appbuild import CHECKED_AS, BuildSpec, build_and_store, read_build
from thaw.appfields import OWN_FIELDS
from thaw.client import ApiClient, ApiError
from thaw.cmdbase import (
    GONE,
    THAW_TOML,
    add_app_flags,
    app_name,
    client_of,
    context_of,
    load_thaw_toml,
    settings,
    url_of,
)
from thaw.launch import add_launch
from thaw.tables import emit, shorten, table, when

if TYPE_CHECKING:
    from thaw.cmdbase import Sub

DONE = ("complete", "failed", "rolled_back")
SCALES = {"min": "min_machines_running", "max": "max_machines"}


def add(sub: Sub, common: argparse.ArgumentParser) -> None:
    apps = sub.add_parser("apps", help="create, list, show, update, delete apps")
    a = apps.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = a.add_parser("create", parents=[common], help="create an app")
    create.add_argument("name", help="the app's name (its host is NAME.DOMAIN)")
    create.add_argument("--image", required=True, help="the image to run, e.g. REGISTRY/NAME:TAG")
    create.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="any AppConfig field, e.g. --set concurrency.soft_limit=20")
    create.set_defaults(run=apps_create)
    a.add_parser("list", parents=[common], help="the apps you can see").set_defaults(
        run=apps_list)
    show = a.add_parser("show", parents=[common], help="an app's whole config")
    show.add_argument("name")
    show.set_defaults(run=apps_show)
    delete = a.add_parser("delete", parents=[common], help="delete an app and its machines")
    delete.add_argument("name")
    delete.set_defaults(run=apps_delete)
    opened = a.add_parser("open", parents=[common],
                          help="the app's URL, opened in a browser when there is a display")
    opened.add_argument("name", nargs="?", default="", help="the app (default: thaw.toml's)")
    opened.add_argument("path", nargs="?", default="/", help="a path on it (default /)")
    opened.add_argument("-c", "--config", type=Path, default=THAW_TOML,
                        help="the thaw.toml that names the app when NAME is not given")
    opened.set_defaults(run=apps_open)
    update = a.add_parser("update", parents=[common], help="change an app's fields")
    update.add_argument("name")
    update.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    update.set_defaults(run=apps_update)

    add_launch(sub, common, deploy)

    d = sub.add_parser("deploy", parents=[common],
                       help="create or update the app of thaw.toml, then roll it out")
    d.add_argument("-c", "--config", type=Path, default=Path("thaw.toml"))
    d.add_argument("--image", default="")
    d.add_argument("--strategy", choices=STRATEGIES, default=None,
                   help="this rollout's strategy (default: the app's deploy.strategy)")
    add_follow_flags(d)
    d.set_defaults(run=deploy)

    scale = sub.add_parser("scale", help="set how many machines an app runs")
    s = scale.add_subparsers(dest="action", required=True, metavar="WHAT")
    for what, text in (("count", "exactly N machines started: min = max = N"),
                       ("min", "at least N machines started (min_machines_running)"),
                       ("max", "at most N machines (max_machines)")):
        p = s.add_parser(what, parents=[common], help=text)
        p.add_argument("n", type=int, metavar="N", help="how many machines")
        add_app_flags(p)
        p.set_defaults(run=scale_app)

    releases = sub.add_parser("releases", parents=[common], help="an app's releases, newest first")
    releases.add_argument("app")
    releases.set_defaults(run=list_releases)
    rollback = sub.add_parser("rollback", parents=[common],
                              help="a new release made from an earlier one")
    rollback.add_argument("app")
    rollback.add_argument("version", type=int)
    add_follow_flags(rollback)
    rollback.set_defaults(run=roll_back)
    events = sub.add_parser("events", parents=[common],
                            help="what the reconciler did to an app, and why")
    events.add_argument("app")
    events.set_defaults(run=list_events)


def digest(config: dict[str, Any]) -> str:
    return str(config.get("image_digest", ""))[7:19] or "unresolved"


def apps_create(args: argparse.Namespace) -> int:
    body = {"name": args.name, "image": args.image, **settings(args.set)}
    parse(body)  # fail early, naming the field
    made = client_of(args).post("/v1/apps", body)
    emit(args.json, made, f"created app {made['name']}: {made['image']} ({digest(made)}), "
                          f"release {made['release']}")
    return 0


def apps_list(args: argparse.Namespace) -> int:
    apps = client_of(args).get("/v1/apps")
    rows = [{**a, "min": a["min_machines_running"], "max": a["max_machines"]} for a in apps]
    emit(args.json, apps, lambda: table(rows, ["name", "release", "min", "max", "auto_stop",
                                               "image"]))
    return 0


def flat(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [pair for k, v in value.items() for pair in flat(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), value)]


def apps_open(args: argparse.Namespace) -> int:
    """As `fly apps open`: the app's URL (the context's `app_url`), in a browser when this
    session has a display, always printed."""
    name = args.name or app_name(argparse.Namespace(app="", config=args.config))
    if not APP_NAME.match(name):
        raise InvalidConfig("name", f"{name[:80]!r} is not an app name")
    client_of(args).get(f"/v1/apps/{name}")  # an app that is not there is said so
    base = url_of(args, name)
    if not base:
        raise contexts.ContextError(
            "this context does not say where apps are served: add it with `thaw context "
            "add NAME --api URL --app-url 'https://{app}.example.com/' --use`")
    url = base.rstrip("/") + "/" + args.path.lstrip("/")
    opened = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and \
        webbrowser.open(url)
    emit(args.json, {"app": name, "url": url, "opened": opened},
         url if opened or args.json else f"{url}\n(no display to open a browser on: "
                                         f"curl {shlex.quote(url)})")
    return 0


def apps_show(args: argparse.Namespace) -> int:
    config = client_of(args).get(f"/v1/apps/{args.name}")
    emit(args.json, config, lambda: "\n".join(f"{k:<24} {v}" for k, v in flat(config)))
    return 0


def apps_update(args: argparse.Namespace) -> int:
    client = client_of(args)
    before = client.get(f"/v1/apps/{args.name}")
    after = client.patch(f"/v1/apps/{args.name}", settings(args.set))
    emit(args.json, after, lambda: changed(before, after))
    return 0


def changed(before: dict[str, Any], after: dict[str, Any]) -> str:
    old = dict(flat(before))
    diffs = [f"{k} {old.get(k)} -> {v}" for k, v in flat(after)
             if old.get(k) != v and k not in ("version", "release")]
    if not diffs:
        return f"{after['name']}: nothing changed"
    release = (f"; release {after['release']}" if after["release"] != before["release"]
               else "")
    return f"updated {after['name']}: " + ", ".join(diffs) + release


def apps_delete(args: argparse.Namespace) -> int:
    gone = client_of(args).delete(f"/v1/apps/{args.name}")
    n = len(gone["machines"])
    emit(args.json, gone, f"deleted app {args.name} and {n} machine{'s' * (n != 1)}")
    return 0


def add_follow_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--detach", action="store_true",
                        help="answer once the release is made; do not follow its rollout")
    parser.add_argument("--wait-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="follow the rollout at most this long (default 300)")


def deploy(args: argparse.Namespace) -> int:
    """Make the app what thaw.toml says (a field left out is its default), then deploy:
    a change of what machines are made from is a new release, followed as it rolls out."""
    body = load_thaw_toml(args.config)
    if args.image:
        body["image"] = args.image
    elif (spec := read_build(args.config)) is not None:
        body["image"] = built_image(args, spec, body)
    wanted = declared(parse(body))
    name = wanted["name"]
    client = client_of(args)
    created = None
    request: dict[str, Any] = {"strategy": args.strategy} if args.strategy else {}
    try:
        request["config"] = replacing(client.get(f"/v1/apps/{name}"), wanted)
    except ApiError as exc:
        if exc.status != 404:
            raise
        created = client.post("/v1/apps", wanted)
    result = client.post(f"/v1/apps/{name}/deploy", request)
    release = result.get("release")
    app = result["app"]
    if args.json:
        emit(True, result, "")
    elif created is not None:
        print(f"created app {name}: release {app['release']}, {app['image']} ({digest(app)})")
    elif release is None:
        print(f"{name} is up to date: release {app['release']}, {app['image']} "
              f"({digest(app)})")
    else:
        print(f"release {release['version']} of {name}: {release['image']} "
              f"({digest(release)}), {release['strategy']}")
    if result.get("shortfall") and not args.json:
        print(f"  note: {result['shortfall']}")
    if release is None or args.detach:
        return 0
    return follow_rollout(client, name, release["version"], args.wait_timeout, args.json)


def built_image(args: argparse.Namespace, spec: BuildSpec, body: dict[str, Any]) -> str:
    """thaw.toml's [build], built and stored where the context keeps images: the
    reference deploy sends."""
    name = parse({**body, "image": CHECKED_AS}).name  # thaw.toml's errors before a build
    context = context_of(args)
    ref = build_and_store(spec, args.config, name, context.images if context else "")
    if not args.json:
        print(f"built {spec.dockerfile} -> {ref}", flush=True)
    return ref


def declared(config: AppConfig) -> dict[str, Any]:
    """Every field an owner sets, defaults included (placement's own fields left out)."""
    fields: dict[str, Any] = msgspec.to_builtins(config)
    return {k: v for k, v in fields.items() if k not in OWN_FIELDS}


def replacing(current: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch that makes `current` exactly `wanted`: every field given, and
    an env variable no longer declared removed (null)."""
    env = {**{k: None for k in current.get("env", {}) if k not in wanted["env"]},
           **wanted["env"]}
    return {**wanted, "env": env}


def follow_rollout(client: ApiClient, app: str, version: int, timeout_s: float,
                   quiet: bool) -> int:
    """Print each change of the release's status and of how many machines run it, until
    the rollout ends (exit 1 unless it completed) or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    seen: tuple[Any, ...] = ()
    while True:
        release = next(r for r in client.get(f"/v1/apps/{app}/releases")
                       if r["version"] == version)
        live = [m for m in client.get(f"/v1/apps/{app}/machines")
                if m["state"] not in GONE]
        on = sum(1 for m in live if m.get("release") == version)
        now = (release["status"], on, len(live))
        if now != seen and not quiet:
            print(f"  {release['status']}: {on} of {len(live)} machines on release {version}"
                  + (f" ({release['reason']})" if release["reason"] else ""))
        seen = now
        if release["status"] in DONE:
            if release["status"] == "complete":
                return 0
            if not quiet:  # where the app went instead
                now_on = client.get(f"/v1/apps/{app}")["release"]
                print(f"  {app} runs release {now_on} again")
            return 1
        if time.monotonic() > deadline:
            print(f"  still {release['status']} after {timeout_s:g} s: "
                  f"thaw releases {app} shows how it goes")
            return 1
        time.sleep(0.5)


def scale_app(args: argparse.Namespace) -> int:
    name = app_name(args)
    client = client_of(args)
    before = client.get(f"/v1/apps/{name}")
    if args.action == "count":
        patch = {"min_machines_running": args.n, "max_machines": max(args.n, 1)}
    else:
        patch = {SCALES[args.action]: args.n}
        if args.action == "min" and args.n > before["max_machines"]:
            patch["max_machines"] = args.n  # min above max raises max with it
    after = client.patch(f"/v1/apps/{name}", patch)
    emit(args.json, after, f"{name}: min {after['min_machines_running']}, "
                           f"max {after['max_machines']} (was min "
                           f"{before['min_machines_running']}, max {before['max_machines']})")
    return 0


def list_releases(args: argparse.Namespace) -> int:
    releases = client_of(args).get(f"/v1/apps/{args.app}/releases")
    rows = [{**r, "created": when(r["created_at"]), "image": shorten(r["image"], 40)}
            for r in releases]
    emit(args.json, releases, lambda: table(
        rows, ["version", "status", "strategy", "created", "image"], below="reason"))
    return 0


def roll_back(args: argparse.Namespace) -> int:
    """A new release made from release `version`, followed as it rolls out (as a deploy
    is); if it fails, the app goes back to the release it replaced."""
    client = client_of(args)
    made = client.post(f"/v1/apps/{args.app}/rollback", {"version": args.version})
    emit(args.json, made, f"release {made['version']} of {args.app}: {made['image']} "
                          f"(from release {args.version}, replacing {made['replaces']}), "
                          f"{made['status']}")
    if args.detach:
        return 0
    return follow_rollout(client, args.app, made["version"], args.wait_timeout, args.json)


def list_events(args: argparse.Namespace) -> int:
    events = client_of(args).get(f"/v1/apps/{args.app}/events")
    rows = [{**e, "when": when(e["at"])} for e in events]
    emit(args.json, events, lambda: table(rows, ["when", "action", "machine", "outcome"],
                                          below="reason"))
    return 0
