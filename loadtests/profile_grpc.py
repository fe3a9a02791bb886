"""Where the edge's time goes on gRPC calls to an h2c machine: py-spy samples `thaw edge`
while h2load sends unary calls through it (bench_grpc.py's set-up), and the samples are
summed by function (own time) and by file (time spent in it or below).

    .venv/bin/python loadtests/profile_grpc.py [--seconds 8] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.bench_grpc import CALL, check, seed
from loadtests.benchlib import free_port, key_file, process, wait_port

ROOT = Path(__file__).resolve().parents[1]


def summarize(raw: str, top: int) -> str:
    """py-spy's raw (collapsed) stacks: `frame;frame;… count` lines."""
    own: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for file in {f.rsplit("(", 1)[-1].split(":")[0] for f in frames}:
            within[file] += n
    lines = [f"{total} samples", "", "own time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines += ["", "time in a file or below:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in within.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for tool in ("h2load", "redis-server", "py-spy"):
        if shutil.which(tool) is None and not (Path(sys.executable).parent / tool).exists():
            raise SystemExit(f"needs {tool}")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    work = Path(tempfile.mkdtemp(prefix="thaw-profile-grpc-"))
    ports = {name: free_port() for name in ("machine", "edge", "admin", "redis")}
    (work / "call.bin").write_bytes(CALL)
    redis_url = f"redis://127.0.0.1:{ports['redis']}/0"
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(process([sys.executable, "-m", "tests.support.grpc_app"],
                                        cpu=1, env={"PORT": str(ports["machine"])}, cwd=ROOT))
            stack.enter_context(process(
                ["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(work)], cpu=1))
            wait_port(ports["machine"])
            wait_port(ports["redis"])
            asyncio.run(seed(redis_url, ports["machine"]))
            edge = stack.enter_context(process(
                [sys.executable, "-m", "thaw", "edge", "--registry", redis_url,
                 "--port", str(ports["edge"]), "--admin-port", str(ports["admin"]),
                 "--placement", "http://127.0.0.1:9", "--log-level", "warning",
                 "--cluster-key-file", str(key_file(work))], log=work / "edge.log"))
            wait_port(ports["edge"])
            check(ports["edge"])
            load = subprocess.Popen(
                ["taskset", "-c", "1", "h2load", "-c", "10", "-m", "10", "-D",
                 str(args.seconds + 2), "-d", str(work / "call.bin"), "-H",
                 "content-type: application/grpc", "-H", "te: trailers", "-H",
                 ":authority: bench.localhost",
                 f"http://127.0.0.1:{ports['edge']}/thaw.test.Probe/Say"],
                stdout=subprocess.DEVNULL)
            try:
                subprocess.run([spy, "record", "--pid", str(edge.pid), "--format", "raw",
                                "--duration", str(args.seconds), "--nonblocking",
                                "--output", str(work / "raw.txt")],
                               check=True, capture_output=True, timeout=args.seconds + 60)
            finally:
                load.wait(timeout=args.seconds + 60)
            print(summarize((work / "raw.txt").read_text(), args.top))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
