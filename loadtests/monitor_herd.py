"""Which process sends which Redis commands during a herd of wakes: the herd platform of
`bench_wakes.py` (one edge, one placement, three agents), `--apps` apps whose machines
were started and stopped before, woken at once under Redis's MONITOR; each command is
given to the process whose connection sent it (`ss -tnp`), commands run inside Lua
scripts are listed under "in scripts". Keys are shown with the app's name as `*`.

    .venv/bin/python loadtests/monitor_herd.py [--apps 100]

Prints, per process, its commands per wake, most frequent first. Loopback only; every
process started is stopped; the work directory is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.bench_wakes import create, get_all, herd_platform, known, stop_all
from loadtests.tinyapp import build_tiny_image
from tests.support.agent_process import wait_until
from tests.support.redis_server import start_redis_server

APP = re.compile(r"(?<=:)s\d+\b")


def ports_to_pids(redis_port: int) -> dict[str, int]:
    """Local port -> pid of every connection to Redis now."""
    found = {}
    listing = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True, check=False)
    for line in listing.stdout.splitlines():
        parts = line.split()
        if len(parts) > 4 and parts[4].endswith(f":{redis_port}"):
            pid = re.search(r"pid=(\d+)", line)
            if pid:
                found[parts[3].rsplit(":", 1)[1]] = int(pid.group(1))
    return found


def command_name(command: str) -> str:
    words = command.split()
    name = words[0].strip('"').upper()
    if name.startswith("EVALSHA") and len(words) > 3:
        return f"{name} {APP.sub('*', words[3].strip(chr(34)))} ({words[2].strip(chr(34))} keys)"
    if len(words) > 1:
        return f"{name} {APP.sub('*', words[1].strip(chr(34)))}"
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=100)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="thaw-monitor-"))
    try:
        image = build_tiny_image(work / "herd" / "layout")
        with start_redis_server() as server, herd_platform(work / "herd",
                                                           server.url) as services:
            names = [f"s{i}" for i in range(args.apps)]
            for name in names:
                create(services, 0, name, image)
            wait_until(lambda: all(known(services, 0, n) for n in names[-5:]), 20, 0.1)
            stop_all(services, names)
            seen: list[tuple[str, str, str]] = []
            done = threading.Event()

            def monitor() -> None:
                client = redis.Redis.from_url(server.url)
                with client.monitor() as stream:
                    for entry in stream.listen():
                        seen.append((entry.get("client_type", ""), str(entry["client_port"]),
                                     entry["command"]))
                        if done.is_set():
                            break

            threading.Thread(target=monitor, daemon=True).start()
            time.sleep(0.5)
            pids = ports_to_pids(server.port)
            first = len(seen)
            asyncio.run(get_all([(services.edge_ports[0], f"{n}.localhost", "/")
                                 for n in names]))
            last = len(seen)
            pids.update((port, pid) for port, pid in ports_to_pids(server.port).items()
                        if port not in pids)
            done.set()
            names_of = {proc.pid: name for name, proc in services.procs.items()}
            per: dict[str, Counter[str]] = defaultdict(Counter)
            for kind, port, command in seen[first:last]:
                who = "in scripts" if kind == "lua" else names_of.get(
                    pids.get(port, 0), f"port {port}")
                per[who][command_name(command)] += 1
            for who, counts in sorted(per.items(), key=lambda item: -item[1].total()):
                print(f"{who}: {counts.total() / args.apps:.1f} commands a wake")
                for name, n in counts.most_common(15):
                    print(f"  {n / args.apps:6.2f} {name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
