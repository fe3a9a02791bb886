"""Shared helpers of the benchmark scripts: processes, wrk runs, figures, the report.

Benchmarks target loopback only, are bounded in time, stop by themselves, and
stop every process they started (by PID).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ground.auth.signing import KeyRing

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks.md"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"port {port} did not open")


@contextlib.contextmanager
def process(args: list[str], *, cpu: int | None = None, env: dict[str, str] | None = None,
            log: Path | None = None, cwd: Path | None = None,
            ) -> Iterator[subprocess.Popen[bytes]]:
    """Run a process (pinned to `cpu` with taskset when given); kill its group at exit."""
    if cpu is not None and shutil.which("taskset"):
        args = ["taskset", "-c", str(cpu), *args]
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})}, cwd=cwd)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if log:
            out.close()  # type: ignore[union-attr]


@dataclass(frozen=True)
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not match:
        raise ValueError(f"cannot read a latency from {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def wrk(url: str, *, host: str | None = None, connections: int = 50, duration_s: int = 5,
        cpu: int | None = None) -> WrkResult:
    args = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "--timeout", "5s"]
    if host:
        args += ["-H", f"Host: {host}"]
    if cpu is not None and shutil.which("taskset"):
        args = ["taskset", "-c", str(cpu), *args]
    out = subprocess.run([*args, url], capture_output=True, text=True, check=True,
                         timeout=duration_s + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    distribution = out.split("Latency Distribution", 1)[1]  # not the "+/- Stdev" column
    p50 = _ms(re.search(r"(?m)^\s*50%\s+(\S+)", distribution).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"(?m)^\s*99%\s+(\S+)", distribution).group(1))  # type: ignore[union-attr]
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return WrkResult(rps, p50, p99, errors + (int(non2xx.group(1)) if non2xx else 0))


def cpu_times() -> list[int]:
    """The machine's aggregate CPU times (/proc/stat `cpu` line, in ticks)."""
    with open("/proc/stat") as stat:
        return [int(v) for v in stat.readline().split()[1:]]


def cpu_s(pid: int) -> float:
    """utime + stime of `pid` (its threads included), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reaped_cpu_s(pid: int) -> float:
    """cutime + cstime of `pid`: the CPU of the children it has waited for (an agent's
    runtime calls, for one), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def busy_s(times: list[int]) -> float:
    """The CPU seconds, every core, in a `cpu_times()` reading: all but idle, iowait and
    steal."""
    return (sum(times[:8]) - times[3] - times[4] - times[7]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """`cpu_s` of `pid` and every live descendant (nginx's workers under its master)."""
    total = cpu_s(pid)
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return total + sum(tree_cpu_s(int(child)) for child in children)


def steal_percent(before: list[int], after: list[int]) -> float:
    """Share of CPU time the hypervisor took between two `cpu_times()` readings."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return 100.0 * delta[7] / max(1, sum(delta[:8]))  # user .. steal


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def machine_line() -> str:
    cpu = "unknown cpu"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.node() or 'host'}: {os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def write_section(name: str, body: str) -> None:
    """Replace (or add) the section between `<!-- name -->` markers in docs/benchmarks.md."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    text = REPORT.read_text() if REPORT.exists() else "# Benchmarks\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    REPORT.write_text(text)


BENCH_KEYS = KeyRing.parse("bench-cluster-key-" + "b" * 32)  # no placement answers anyway


def key_file(work: Path) -> Path:
    """A cluster key file (mode 0600) for the services a benchmark starts."""
    path = work / "cluster.key"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_bytes(BENCH_KEYS.keys[0])
    return path
