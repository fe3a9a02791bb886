"""`thaw loadtest SCENARIO`: run one of the load-test kit's scenarios (loadtests/k6/,
loadtests/locust/) against a deployment and write a report.

The driver readies the deployment through placement's API (a cold scenario stops the
app's machines first, wake-herd creates its apps, fields a scenario needs are set on the
app and put back after), samples the machines of the apps under load every
--sample-interval seconds, runs k6 or Locust as a subprocess with the SLO thresholds,
does the scenario's action mid-run (a deploy, a host kill), and writes into --report DIR a
summary table (summary.md), a plot (plot.png) and the raw files. Its exit status is the
tool's: non-zero when a threshold failed (k6: 99, Locust: 1), or 1 when the action failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
DEFAULT_EDGE = "http://127.0.0.1:8080"
SCENARIO_NAMES = ("cold-burst", "steady", "ramp", "wake-herd", "deploy", "host-loss")


def env(name: str, default: str) -> str:
    return os.environ.get(f"THAW_{name}", default)


def parse_duration(text: str) -> float:
    """`30s`, `2m`, `500ms`, `1h` or plain seconds → seconds (> 0)."""
    match = DURATION.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration like 30s or 2m, not {text!r}")
    return float(match.group(1)) * UNITS[match.group(2)]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `loadtest` to an argparse sub-parsers object."""
    p: argparse.ArgumentParser = sub.add_parser(
        "loadtest", help="run a k6 or Locust load scenario and write a report",
        description="Run a load scenario with k6 or Locust against a deployment (thaw up "
                    "or any other) and write a report: summary.md (requests, errors, "
                    "latency, hold and cold p99, machines, thresholds) and plot.png. The "
                    "exit status is the thresholds' (k6: 99, Locust: 1 when one fails). "
                    "See docs/loadtesting.md.")
    p.add_argument("scenario", choices=SCENARIO_NAMES, help="what load, and what happens "
                   "under it (docs/loadtesting.md)")
    p.add_argument("--tool", choices=("k6", "locust"), default="k6", help="the load tool")
    p.add_argument("--duration", type=parse_duration, default=30.0, metavar="DURATION",
                   help="how long the load lasts, e.g. 30s or 2m (not for bursts)")
    p.add_argument("--requests", type=int, default=200, metavar="N",
                   help="cold-burst, wake-herd: requests sent at once")
    p.add_argument("--rate", type=float, default=50.0,
                   help="steady, deploy, host-loss: requests per second")
    p.add_argument("--peak-concurrency", type=int, default=10, metavar="N",
                   help="ramp: concurrent clients at the top (each sends its next request "
                        "when the last answers)")
    p.add_argument("--think-ms", type=float, default=0.0,
                   help="ramp: pause of each client between its requests")
    p.add_argument("--apps", type=int, default=8, metavar="K",
                   help="wake-herd: how many cold apps")
    p.add_argument("--app", default=env("LOADTEST_APP", "hello"),
                   help="the app under load (wake-herd copies its image)")
    p.add_argument("--domain", default="", help="apps are served as NAME.DOMAIN (default: "
                   "the context's, else localhost)")
    p.add_argument("--host", default="", help="the Host header (default APP.DOMAIN)")
    p.add_argument("--path", default="/", help="the path every request asks for")
    p.add_argument("--base-url", default=env("EDGE_URL", ""),
                   help="the edge (default $THAW_EDGE_URL, else the context's, else "
                        f"{DEFAULT_EDGE})")
    p.add_argument("--api", default=env("API_URL", ""),
                   metavar="[http://]HOST:PORT",
                   help="placement's API (default $THAW_API_URL, else the context's, else "
                        "127.0.0.1:4280)")
    p.add_argument("--context", default=env("CONTEXT", ""), metavar="NAME",
                   help="the platform, by name (default $THAW_CONTEXT, else the current "
                        "one: thaw context list; thaw up writes it)")
    p.add_argument("--token", default=env("TOKEN", ""),
                   help="bearer token (default $THAW_TOKEN, else the context's, else "
                        "./.thaw/admin.token)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="an AppConfig field set on the app for the run and put back after "
                        "(repeatable; over the scenario's own)")
    p.add_argument("--max-error-rate", type=float, default=0.0,
                   help="SLO: errors (non-2xx) / requests")
    p.add_argument("--warm-p99-ms", type=float, default=1000.0,
                   help="SLO: p99 of requests that were not held")
    p.add_argument("--hold-p99-ms", type=float, default=5000.0,
                   help="SLO: p99 of the edge's hold time (Server-Timing hold)")
    p.add_argument("--cold-p99-ms", type=float, default=6000.0,
                   help="SLO: p99 of the whole cold request")
    p.add_argument("--action-at", type=parse_duration, default=None, metavar="DURATION",
                   help="deploy, host-loss: when the action happens (default: mid-run)")
    p.add_argument("--deploy-image", default="",
                   help="deploy: deploy this image (default: a release of the same image "
                        "with a changed env)")
    p.add_argument("--kill-cmd", default="",
                   help="host-loss: a shell command that kills the worker ({worker} and "
                        "{url} replaced); default: kill -9 of its agent and machines here")
    p.add_argument("--kill-worker", default="",
                   help="host-loss: the worker to kill (default: the app's machine's)")
    p.add_argument("--max-vus", type=int, default=200,
                   help="k6: most VUs an arrival-rate scenario may use")
    p.add_argument("--settle", type=parse_duration, default=None, metavar="DURATION",
                   help="keep sampling machines this long after the load (ramp: until "
                        "they stopped, 60s at most)")
    p.add_argument("--sample-interval", type=float, default=0.5, metavar="SECONDS",
                   help="how often machines are sampled from the API")
    p.add_argument("--report", type=Path, default=None, metavar="DIR",
                   help="where the report goes (default .thaw/loadtests/SCENARIO-TIME)")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the scenario `args` name; the tool's exit status (see the module's doc)."""
    from loadtests.kit.driver import LoadTest

    find_platform(args)
    print(f"thaw loadtest: {args.scenario} against the edge {args.base_url} and the API "
          f"{args.api}", flush=True)
    return LoadTest(args, command_line(args)).run()


def find_platform(args: argparse.Namespace) -> None:
    """Fill in the API, token, edge and domain a run was not given, as the CLI finds
    them: from the context (`--context`, else the current one; `thaw up` writes `local`
    with its own ports), else make up's defaults. An --api given bypasses contexts."""
    from thaw import contexts
    from thaw.cmdbase import DEFAULT_API, LOOPBACK, context_token

    context = None if args.api else contexts.chosen(args.context)
    if context is not None:
        host = urlsplit(context.api).hostname
        if not args.context and host not in LOOPBACK:
            current = contexts.load().current
            raise ValueError(f"the current context {current!r} is not on this host "
                             f"({context.api}): a load test goes to a remote platform only "
                             f"when asked (--context {current}, or --api URL)")
        args.token = args.token or context_token(context)
        args.cacert = getattr(args, "cacert", "") or context.cacert
    args.api = args.api or (context.api if context is not None else DEFAULT_API)
    base, domain = edge_of(context.app_url if context is not None else "", args.app)
    args.base_url = args.base_url or base
    args.domain = args.domain or domain


def edge_of(app_url: str, app: str) -> tuple[str, str]:
    """(the edge's base URL, the apps' domain) from a context's plain-HTTP `app_url`
    (`http://{app}.DOMAIN:PORT/`: the edge at `app`'s name, or at 127.0.0.1 for a
    *.localhost domain); make up's defaults for none, HTTPS (the kit's tools would need
    its CA: pass --base-url) or a template of another form."""
    parts = urlsplit(app_url.replace("{app}", "x"))
    host = parts.hostname or ""
    if parts.scheme != "http" or not app_url.startswith("http://{app}.") or not host:
        return DEFAULT_EDGE, "localhost"
    domain = host.removeprefix("x.")
    local = domain == "localhost" or domain.endswith(".localhost")
    return f"http://{'127.0.0.1' if local else f'{app}.{domain}'}:{parts.port or 80}", domain


def command_line(args: argparse.Namespace) -> str:
    """How this run was asked for, for the report."""
    given = getattr(args, "command_line", "")
    if given:
        return str(given)
    if sys.argv[1:2] == ["loadtest"]:
        return shlex.join(["thaw", *sys.argv[1:]])
    return f"thaw loadtest {args.scenario}"


def main(argv: list[str] | None = None) -> int:
    """`python -m thaw.loadtest SCENARIO …`: the same command without the CLI."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="thaw")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["loadtest", *argv])
    args.command_line = shlex.join(["python", "-m", "thaw.loadtest", *argv])
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line, as the CLI says failures
        print(f"thaw loadtest: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
