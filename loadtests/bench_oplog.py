"""The op log under a herd: offers/s against one agent, and the wake latency of a herd of
cold apps through `thaw up` — the working tree beside another revision, rounds alternated.

    .venv/bin/python loadtests/bench_oplog.py [--base REV] [--rounds 3] [--offers 2000]
        [--concurrency 64] [--apps 30] [--no-write]

1. Offers: a `thaw agent` of each tree (run from that tree's sources, fresh state dir)
   takes `--offers` signed offers of stopped machines (start=false: each is one op-log
   append made durable before the answer), `--concurrency` at a time; offers/s and the
   p50/p99 of one offer's answer.
2. Wake herd: `thaw up` of each tree (2 agents); `--apps` apps are created, then one
   request to each goes through the edge at once; p50/p99 time to first byte.
The base revision is checked out into a temporary git worktree (removed at the end).
Loopback only; every process started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import yarl

from loadtests.benchlib import (
    REPO,
    free_port,
    machine_line,
    median,
    percentile,
    wait_port,
    write_section,
)
from tests.support.credentials import CLUSTER_KEY, SIGNER


def worktree(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(into), rev],
                   check=True, capture_output=True)
    return into


def start(tree: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "THAW_CLUSTER_KEY": CLUSTER_KEY, "THAW_LOG_LEVEL": "warning",
           "THAW_NATIVE": "0", "PYTHONPATH": str(tree)}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "thaw", *args], cwd=tree, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def offers(url: str, count: int, concurrency: int) -> tuple[float, list[float]]:
    """(offers/s, latencies ms) of `count` signed offers, `concurrency` at a time."""
    latencies: list[float] = []
    queue = iter(range(count))

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in queue:
            body = (b'{"key": "k%d", "app": "bench", "image": "img", "start": false, '
                    b'"guest": {"cpus": 0.001, "memory_mb": 1}}' % i)
            target, headers = SIGNER.signed("POST", yarl.URL(url + "/v1/offers"), body)
            began = time.perf_counter()
            async with session.post(target, data=body, headers=headers) as reply:
                await reply.read()
                assert reply.status == 201, reply.status
            latencies.append((time.perf_counter() - began) * 1000)

    began = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return count / (time.perf_counter() - began), latencies


def offers_round(tree: Path, work: Path, count: int, concurrency: int) -> dict[str, float]:
    port = free_port()
    agent = start(tree, ["agent", "--port", str(port), "--state-dir", str(work / "agent"),
                         "--cpus", "64", "--memory-mb", "65536"], work / "agent.log")
    try:
        wait_port(port)
        rate, latencies = asyncio.run(offers(f"http://127.0.0.1:{port}", count, concurrency))
    finally:
        stop(agent)
    return {"rate": rate, "p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


async def herd(api: str, edge_port: int, token: str, layout: str, apps: int) -> list[float]:
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=auth) as session:
        for _ in range(600):  # `thaw up` is ready when it has built and created app hello
            async with session.get(f"{api}/v1/apps/hello") as reply:
                if reply.status == 200:
                    break
            await asyncio.sleep(0.1)
        for i in range(apps):
            body = {"name": f"herd{i}", "image": layout, "guest": {"cpus": 0.1, "memory_mb": 64},
                    "health": {"path": "/healthz", "timeout_s": 20}}
            async with session.post(f"{api}/v1/apps", json=body) as reply:
                assert reply.status == 201, await reply.text()
    await asyncio.sleep(1.0)  # the edge hears of the apps through the registry feed

    async def one(i: int) -> float:
        began = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", edge_port)
        writer.write(b"GET / HTTP/1.1\r\nHost: herd%d.localhost\r\nConnection: close\r\n\r\n"
                     % i)
        first = await reader.read(1)
        elapsed = (time.perf_counter() - began) * 1000
        rest = await reader.read()
        writer.close()
        assert (first + rest).startswith(b"HTTP/1.1 200"), (first + rest)[:200]
        return elapsed

    return list(await asyncio.gather(*(one(i) for i in range(apps))))


def herd_round(tree: Path, work: Path, apps: int) -> dict[str, float]:
    api_port, edge_port = free_port(), free_port()
    state = work / "up"
    up = start(tree, ["up", "--state-dir", str(state), "--agents", "2", "--api-port",
                      str(api_port), "--edge-port", str(edge_port)], work / "up.log")
    try:
        wait_port(edge_port, timeout_s=120)
        wait_port(api_port)
        token = (state / "admin.token").read_text().strip()
        layout = f"oci:{state / 'images' / 'layout'}:latest"
        ttfb = asyncio.run(herd(f"http://127.0.0.1:{api_port}", edge_port, token, layout, apps))
    finally:
        stop(up)
    return {"p50": percentile(ttfb, 50), "p99": percentile(ttfb, 99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--offers", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--apps", type=int, default=30)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="thaw-bench-oplog-") as tmp:
        base = worktree(args.base, Path(tmp) / "base")
        trees = {f"base ({args.base})": base, "working tree": REPO}
        try:
            for round_ in range(args.rounds):
                for name, tree in trees.items():
                    work = Path(tmp) / f"{round_}-{name.split()[0]}"
                    work.mkdir()
                    figures = {f"offers {k}": v for k, v in
                               offers_round(tree, work, args.offers, args.concurrency).items()}
                    figures |= {f"herd {k}": v for k, v in
                                herd_round(tree, work, args.apps).items()}
                    for key, value in figures.items():
                        results.setdefault(name, {}).setdefault(key, []).append(value)
                    print(name, {k: round(v, 1) for k, v in figures.items()}, flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                           check=False, capture_output=True)
    report(results, args)


def report(results: dict[str, dict[str, list[float]]], args: Any) -> None:
    command = (f".venv/bin/python loadtests/bench_oplog.py --base {args.base} --rounds "
               f"{args.rounds} --offers {args.offers} --concurrency {args.concurrency} "
               f"--apps {args.apps}")
    rows = ["| tree | offers/s | offer p50 ms | offer p99 ms | herd TTFB p50 ms | "
            "herd TTFB p99 ms |", "|---|---|---|---|---|---|"]
    for name, figures in results.items():
        med = {k: median(v) for k, v in figures.items()}
        rows.append(f"| {name} | {med['offers rate']:.0f} | {med['offers p50']:.1f} | "
                    f"{med['offers p99']:.1f} | {med['herd p50']:.0f} | {med['herd p99']:.0f} |")
    body = "\n".join([
        "## The op log under a herd (`loadtests/bench_oplog.py`)", "",
        f"Command: `{command}`  ", f"Machine: {machine_line()}", "",
        f"Medians over {args.rounds} alternated rounds. Offers: stopped machines, one "
        "durable op-log append each, answered once durable. Herd: one cold request to each "
        f"of {args.apps} new apps at once through `thaw up` (2 agents).", "", *rows, "",
    ])
    print(body)
    if not args.no_write:
        write_section("oplog", body)


if __name__ == "__main__":
    main()
