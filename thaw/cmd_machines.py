"""Commands on an app's machines: machines, logs (followed with -f), placements."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from thaw.client import ApiClient, ApiError
from thaw.cmdbase import client_of
from thaw.tables import emit, printable, table, when

if TYPE_CHECKING:
    from thaw.cmdbase import Sub

MACHINE_COLUMNS = ["id", "state", "release", "worker", "region", "address", "created"]
# what --wait waits for after each action
REACHES = {"create": "started", "start": "started", "stop": "stopped",
           "suspend": "suspended", "destroy": "destroyed"}
DOING = {"start": "starting", "stop": "stopping", "suspend": "suspending",
         "destroy": "destroying"}


def add(sub: Sub, common: argparse.ArgumentParser) -> None:
    machines = sub.add_parser("machines",
                              help="create, list, start, stop, suspend, destroy machines")
    m = machines.add_subparsers(dest="action", required=True, metavar="ACTION")
    listed = m.add_parser("list", parents=[common], help="an app's machines")
    listed.add_argument("app")
    listed.set_defaults(run=list_machines)
    create = m.add_parser("create", parents=[common],
                          help="place one more machine through the market")
    create.add_argument("app")
    create.add_argument("--region", default="", help="where (default: the primary region)")
    create.add_argument("--stopped", action="store_true",
                        help="create it stopped (a standby), image pulled")
    wait_flags(create)
    create.set_defaults(run=create_machine)
    for action in ("start", "stop", "suspend", "destroy"):
        p = m.add_parser(action, parents=[common], help=f"{action} a machine")
        p.add_argument("app")
        p.add_argument("id")
        wait_flags(p)
        p.set_defaults(run=act_on_machine)

    logs = sub.add_parser("logs", parents=[common],
                          help="an app's machine logs, each line with its machine's id")
    logs.add_argument("app")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--machine", default="", help="only this machine's lines")
    logs.add_argument("--tail-bytes", type=int, default=16384, metavar="BYTES",
                      help="how much of each log's end to start from (default 16384)")
    logs.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                      help="seconds between reads when following (default 1)")
    logs.set_defaults(run=show_logs)

    placements = sub.add_parser("placements", parents=[common],
                                help="an app's last placement decisions, term by term")
    placements.add_argument("app")
    placements.add_argument("-n", "--last", type=int, default=5, metavar="N",
                            help="how many decisions (default 5)")
    placements.set_defaults(run=show_placements)


def wait_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true",
                   help="answer once the machine has reached the state asked for")
    p.add_argument("--wait-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="wait at most this long (default 60, at most 300)")


def machine_table(views: list[dict[str, Any]]) -> str:
    if not views:
        return "no machines (a request wakes one)"
    return table([{**v, "created": when(v.get("created_at")), "why": why(v)} for v in views],
                 MACHINE_COLUMNS, below="why")


# Events whose reason says how a machine's process ended, or why it failed.
TOLD_EVENTS = frozenset({"crash", "fail", "exited"})


def why(view: dict[str, Any]) -> str:
    """"crash: oom", "fail: crashed 6 times…": the last event, when it tells an end."""
    events = view.get("events") or []
    last = events[-1] if events else {}
    clean_stop = last.get("event") == "exited" and last.get("reason") == "exited(0)"
    if last.get("event") in TOLD_EVENTS and last.get("reason") and not clean_stop:
        return f"{last['event']}: {last['reason']}"
    return ""


def list_machines(args: argparse.Namespace) -> int:
    views = client_of(args).get(f"/v1/apps/{args.app}/machines")
    emit(args.json, views, lambda: machine_table(views))
    return 0


def create_machine(args: argparse.Namespace) -> int:
    client = client_of(args)
    made = client.post(f"/v1/apps/{args.app}/machines",
                       {"start": not args.stopped, "region": args.region})
    if args.wait:
        made = wait(client, args.app, made["id"], "stopped" if args.stopped else "started",
                    args.wait_timeout)
    emit(args.json, made, f"created machine {made['id']} of {args.app} on "
                          f"{made.get('worker', '?')}: {made['state']}")
    return 0


def act_on_machine(args: argparse.Namespace) -> int:
    client = client_of(args)
    base = f"/v1/apps/{args.app}/machines/{args.id}"
    view = (client.delete(base) if args.action == "destroy"
            else client.post(f"{base}/{args.action}"))
    if args.wait:
        view = wait(client, args.app, args.id, REACHES[args.action], args.wait_timeout)
        line = f"machine {args.id} of {args.app}: {view['state']}"
    else:
        line = f"{DOING[args.action]} machine {args.id} of {args.app} (now {view['state']})"
    emit(args.json, view, line)
    return 0


def wait(client: ApiClient, app: str, mid: str, state: str, timeout_s: float
         ) -> dict[str, Any]:
    try:
        view: dict[str, Any] = client.get(
            f"/v1/apps/{app}/machines/{mid}/wait?state={state}&timeout_s={timeout_s:g}")
    except ApiError as exc:
        if exc.status == 404 and state == "destroyed":  # gone so far it is not known
            return {"id": mid, "state": "destroyed"}
        raise
    return view


def show_logs(args: argparse.Namespace) -> int:
    client = client_of(args)
    cursor = ""
    try:
        while True:
            query = (f"?tail_bytes={args.tail_bytes}&cursor={quote(cursor)}"
                     f"&machine={quote(args.machine)}")
            answer = client.get(f"/v1/apps/{args.app}/logs{query}")
            cursor = answer["cursor"]
            logs = answer["logs"]
            if args.json and not args.follow:
                emit(True, answer, "")
            else:
                print_lines(logs, args.json)
            if not args.follow:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:  # how a follow ends
        return 0


def print_lines(logs: list[dict[str, Any]], as_json: bool) -> None:
    for log in logs:
        for text in log["lines"]:
            if as_json:  # one JSON object per line, for a script following along
                print(json.dumps({"machine": log["machine"], "line": text}), flush=True)
            else:
                print(f"{log['machine']}  {printable(text)}", flush=True)


def show_placements(args: argparse.Namespace) -> int:
    decisions = client_of(args).get(f"/v1/apps/{args.app}/placements")[:max(args.last, 0)]
    emit(args.json, decisions, lambda: "\n\n".join(decision(d) for d in decisions)
         or f"no placement decisions for {args.app} yet")
    return 0


def decision(d: dict[str, Any]) -> str:
    """One decision: a summary line, the ranked workers with each term's value and the
    offer each got, then the workers filtered out and why."""
    offers = {o["worker"]: o for o in d["offers"]}
    head = (f"{when(d['at'])}  {d['outcome']}  region {d['region']}  "
            f"{d['considered']} of {d['fleet']} workers considered")
    terms = sorted({t for r in d["ranked"] for t in r["terms"]})
    rows = []
    for r in d["ranked"]:
        offer = offers.get(r["worker"])
        rows.append({"worker": r["worker"], "score": f"{r['score']:.3f}",
                     **{t: f"{r['terms'].get(t, 0):.3f}" for t in terms},
                     "offer": "" if offer is None else
                     f"{offer['reply']} {offer['machine_id'] or offer['message']}".strip()})
    out = [head]
    if rows:
        out.append(table(rows, ["worker", "score", *terms, "offer"]))
    out += [f"filtered {f['worker']} ({f['stage']}): {f['reason']}" for f in d["filtered"]]
    return "\n".join(out)
