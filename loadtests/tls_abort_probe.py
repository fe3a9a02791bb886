"""Aborted TLS handshakes against the edge's TLS port: the edge's RSS before, after
N of each kind, and some seconds later (issue 26).

    python loadtests/tls_abort_probe.py [--loop uvloop|asyncio] [-n 3000] [--batch 100]
        [--kinds silent,partial,midway,held] [--settle-s 10] [--trim] [--trim-each]
        [--objects] [--env NAME=VALUE] [--config JSON] [--tls JSON]

The edge runs in a child process (tests/support/tls_aborts.py: warm, one app and one
machine, TLS from a LocalCA) on the loop named, so the RSS read from /proc/PID/status is
the edge's alone. The kinds are that module's (`silent`, `partial`, `midway`: N
connections, `--batch` open together), and `held`: N silent connections open at once
until the edge closes them (its handshake deadline; the RSS while they are open is
printed too).

A warm HTTPS request is sent before and after each kind. `--trim`: after the settle,
the edge calls glibc's malloc_trim(0) and its RSS is read again (what is left is
retained, not free memory the allocator kept); `--trim-each`: after each kind.
`--objects`: the edge runs with tracemalloc, and prints the objects by type (gc) and
the allocation sites grown since the start. `--env`: in the edge's environment (e.g.
MALLOC_ARENA_MAX=2). `--config`, `--tls`: EdgeConfig and TlsConfig fields (JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.tls_aborts import (
    KINDS,
    EdgeProcess,
    abort,
    client_hello,
    hold_silent,
)


def run_kind(edge: EdgeProcess, kind: str, args: argparse.Namespace, hello: bytes,
             start: int) -> None:
    before = edge.rss()
    if kind == "held":
        closed, last, held = hold_silent(edge.port, args.n, args.hold_limit_s, edge.pid)
        print(f"held    {args.n} silent at once: RSS {held} KB while open "
              f"({(held - before) / args.n:+.2f} KB each); the edge closed {closed} "
              f"(the last after {last:.1f} s)")
    else:
        abort(edge.port, kind, args.n, hello, args.batch)
    time.sleep(0.5)
    after = edge.rss()
    print(f"{kind:7} n={args.n}: RSS {before} -> {after} KB "
          f"({(after - before) / args.n:+.2f} KB/handshake); "
          f"warm request {edge.warm_request()}; edge fds {edge.fds()}")
    if args.trim_each:
        trimmed = int(edge.ask("trim")["rss_kb"])  # type: ignore[call-overload]
        print(f"        after malloc_trim(0): RSS {trimmed} KB "
              f"({trimmed - start:+d} KB since the start)")


def run(args: argparse.Namespace) -> None:
    env = dict(pair.split("=", 1) for pair in args.env)
    edge = EdgeProcess(args.loop, json.loads(args.config), json.loads(args.tls), env,
                       args.objects)
    try:
        print(f"edge pid {edge.pid} loop {edge.loop} tls :{edge.port} "
              f"{' '.join(f'{k}={v}' for k, v in env.items())} "
              f"config {args.config} tls {args.tls}")
        hello = client_hello()
        for _ in range(20):  # the first handshakes' one-time allocations
            edge.warm_request()
        start = edge.rss()
        print(f"start: warm request {edge.warm_request()}, RSS {start} KB, "
              f"edge fds {edge.fds()}")
        for kind in args.kinds.split(","):
            run_kind(edge, kind, args, hello, start)
        total = edge.rss()
        time.sleep(args.settle_s)
        settled = edge.rss()
        print(f"all kinds: RSS {start} -> {total} KB, {args.settle_s:.0f} s later "
              f"{settled} KB (warm request {edge.warm_request()})")
        if args.trim:
            answer = edge.ask("trim")
            trimmed = int(answer["rss_kb"])  # type: ignore[call-overload]
            print(f"after malloc_trim(0) ({answer['trim_ms']:.1f} ms): RSS {trimmed} KB "
                  f"({trimmed - start:+d} KB since the start)")
        live = edge.ask("live")
        print(f"connection objects alive: {live['before_gc']}; after gc.collect(): "
              f"{live['live']}")
        if args.objects:
            answer = edge.ask("objects")
            print(f"traced by tracemalloc: {answer.get('traced_kb')} KB")
            print("objects grown since the start (by type):")
            for name, count in answer["types"]:  # type: ignore[attr-defined]
                print(f"  {count:8d} {name}")
            print("top allocation sites grown since the start:")
            for line in answer.get("top", []):  # type: ignore[attr-defined]
                print("  " + line)
    finally:
        edge.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("-n", type=int, default=3000, help="handshakes of each kind")
    parser.add_argument("--batch", type=int, default=100, help="connections open together")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--hold-limit-s", type=float, default=75.0)
    parser.add_argument("--trim", action="store_true")
    parser.add_argument("--trim-each", action="store_true")
    parser.add_argument("--objects", action="store_true")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--config", default="{}", help="EdgeConfig fields (JSON)")
    parser.add_argument("--tls", default="{}", help="TlsConfig fields (JSON)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
