"""Cold start overhead and resume from suspend, through `thaw up`, on loopback.

    .venv/bin/python loadtests/bench_cold.py [--starts 30] [--resumes 30]

1. Boot baseline: the example app (`examples/hello`) is launched directly,
   `python3 app.py` with a free PORT, and timed from spawn to its first
   accepted TCP connection — the machine's own boot time, no thaw involved.
2. Cold starts: `thaw up` runs with the app; the machine is stopped through
   the API (and waited for), then one request goes through the edge; time to
   first byte is measured on a raw socket. Overhead = TTFB - median boot.
   The image is cached (pulled once before measuring).
3. Resume: the machine is suspended through the API, then one request; TTFB.
Figures: p50/p99 over all runs, plus the Server-Timing split of the edge.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.benchlib import REPO, free_port, machine_line, median, percentile, write_section
from tests.support.agent_process import call
from tests.support.platform import ThawUp

HOST = "hello.localhost"


def boot_baseline(runs: int) -> list[float]:
    """Spawn-to-first-accept of `python3 app.py`, in ms."""
    app = REPO / "examples" / "hello"
    times = []
    for _ in range(runs):
        port = free_port()
        began = time.perf_counter()
        proc = subprocess.Popen(["/usr/bin/python3", "app.py"], cwd=app,
                                env={**os.environ, "PORT": str(port)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.0005)
            times.append((time.perf_counter() - began) * 1000)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return times


def ttfb(port: int) -> tuple[float, int, str]:
    """(ms to the first response byte, status, Server-Timing) of one GET through the edge."""
    request = f"GET / HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode()
    began = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        first = sock.recv(1)
        elapsed = (time.perf_counter() - began) * 1000
        data = first
        while chunk := sock.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode()
    status = int(head.split()[1])
    timing = re.search(r"(?im)^server-timing:\s*(.+)$", head)
    return elapsed, status, timing.group(1).strip() if timing else ""


def machine_of(up: ThawUp) -> dict[str, Any]:
    _, machines = call("GET", f"{up.api}/v1/apps/hello/machines", token=up.token)
    live = [m for m in machines if m["state"] not in ("destroyed",)]
    assert len(live) == 1, live
    return live[0]


def settle(up: ThawUp, action: str, target: str) -> None:
    mid = machine_of(up)["id"]
    status, body = call("POST", f"{up.api}/v1/apps/hello/machines/{mid}/{action}",
                        token=up.token)
    assert status == 200, body
    status, body = call("GET", f"{up.api}/v1/apps/hello/machines/{mid}/wait"
                               f"?state={target}&timeout_s=20", timeout_s=30, token=up.token)
    assert status == 200, body
    time.sleep(0.05)  # let the edge's view hear of it through the change feed


def measure(up: ThawUp, runs: int, action: str, target: str,
            boots: list[float] | None = None) -> list[tuple[float, str]]:
    """`runs` requests, each after `action`; with `boots`, one boot baseline before each."""
    results = []
    for _ in range(runs):
        settle(up, action, target)
        if boots is not None:
            boots.extend(boot_baseline(1))
        elapsed, status, timing = ttfb(up.edge_port)
        assert status == 200, (status, timing)
        results.append((elapsed, timing))
    return results


def timing_medians(results: list[tuple[float, str]]) -> dict[str, float]:
    parts: dict[str, list[float]] = {}
    for _, timing in results:
        for name, dur in re.findall(r"(\w+);dur=([\d.]+)", timing):
            parts.setdefault(name, []).append(float(dur))
    return {name: median(values) for name, values in parts.items()}


def summary(name: str, values: list[float]) -> str:
    return f"| {name} | {median(values):.1f} | {percentile(values, 99):.1f} | {len(values)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--resumes", type=int, default=30)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    boots: list[float] = []
    state = Path(tempfile.mkdtemp(prefix="thaw-bench-cold-"))
    up = ThawUp(state, agents=1, hello=["idle_timeout_s=3600"]).start()
    try:
        first, status, _ = ttfb(up.edge_port)  # pulls and unpacks the image once
        assert status == 200
        cold = measure(up, args.starts, "stop", "stopped", boots)
        resumed = measure(up, args.resumes, "suspend", "suspended")
    finally:
        up.cleanup()
        shutil.rmtree(state, ignore_errors=True)
    cold_ms = [t for t, _ in cold]
    overhead = [t - boot for t, boot in zip(cold_ms, boots, strict=True)]
    resume_ms = [t for t, _ in resumed]
    lines = [
        "## Cold start and resume (`loadtests/bench_cold.py`)", "",
        f"Command: `python loadtests/bench_cold.py {' '.join(sys.argv[1:])}`  ",
        f"Machine: {machine_line()}  ",
        "`thaw up` with 1 agent (bubblewrap sandbox when present), app `hello` (stdlib "
        "http.server), image cached; each cold start follows a stop through the API.", "",
        "| measure (ms) | p50 | p99 | runs |", "|---|---|---|---|",
        summary("app boot alone (spawn → first accept)", boots),
        summary("cold request TTFB through the edge", cold_ms),
        summary("cold overhead = TTFB - boot measured just before", overhead),
        summary("request TTFB after suspend (resume)", resume_ms), "",
        f"- first request ever (pull + unpack + boot): {first:.1f} ms",
        "- Server-Timing medians, cold: " + json.dumps(timing_medians(cold)),
        "- Server-Timing medians, resume: " + json.dumps(timing_medians(resumed)),
        f"- targets: cold overhead p50 ≤ 10 ms: "
        f"{'met' if median(overhead) <= 10 else 'NOT met'}; resume p50 ≤ 5 ms: "
        f"{'met' if median(resume_ms) <= 5 else 'NOT met'}",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("cold", text)


if __name__ == "__main__":
    main()
