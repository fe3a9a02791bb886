"""thaw's load scenarios for Locust, headless, with the SLOs checked at the end.

    locust -f loadtests/locust/locustfile.py --headless --host http://127.0.0.1:8080 \\
        --scenario cold-burst --app-host hello.localhost --requests 200

Scenarios (`--scenario`, or $SCENARIO), the same as loadtests/k6/:
  cold-burst  --requests users, each sends one GET, all spawned at once
  steady      --rate GETs/s for --duration-s (users of --user-rate GETs/s each)
  ramp        1 → --peak-concurrency users over 40% of --duration-s, 20% at the peak, 40%
              back down to 0 (a LoadTestShape); each sends its next GET when the last
              answers (after --think-ms): thaw scales on requests in flight
  wake-herd   like cold-burst, user i asking app i mod len(--app-hosts)
  deploy, host-loss
              steady load; `thaw loadtest` triggers the deploy or the kill mid-run

Every option also reads the environment variable the k6 scenarios read (APP_HOST,
REQUESTS, RATE, DURATION_S, HOLD_P99_MS, …; see --help). The SLOs: errors (non-2xx,
status 0 for a refused connection or a timeout) at most --max-error-rate, warm p99 below
--warm-p99-ms, hold p99 and cold p99 (from the edge's Server-Timing) below --hold-p99-ms
and --cold-p99-ms; cold-burst and wake-herd also need one cold request. Locust exits 1
when one fails. Locust's own stats (--csv, --json-file) count the GETs only; hold and
cold times are in this file's verdict, its --summary-json and --samples-csv.
"""

from __future__ import annotations

import csv
import json
import math
import time
from typing import Any

from locust import FastHttpUser, LoadTestShape, constant_pacing, events, task
from locust.env import Environment
from slo import Slo, Tally, evaluate, server_timing, summary_export, verdict_lines

SCENARIOS = ("cold-burst", "steady", "ramp", "wake-herd", "deploy", "host-loss")
BURSTS = ("cold-burst", "wake-herd")
BURST_TIMEOUT_S = 120.0
SAMPLE_COLUMNS = ["metric_name", "timestamp", "metric_value", "status"]


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    def option(name: str, env: str, default: Any, help: str, **kwargs: Any) -> None:
        parser.add_argument(name, env_var=env, default=default, help=help,
                            include_in_web_ui=False, **kwargs)

    option("--scenario", "SCENARIO", "steady", "one of " + ", ".join(SCENARIOS),
           choices=SCENARIOS)
    option("--app-host", "APP_HOST", "hello.localhost", "the Host header: the app's name")
    option("--app-hosts", "APP_HOSTS", "", "wake-herd: the apps' Host names, comma-separated")
    option("--url-path", "URL_PATH", "/", "the path every GET asks for")
    option("--requests", "REQUESTS", 200, "cold-burst, wake-herd: GETs at once", type=int)
    option("--duration-s", "DURATION_S", 30.0, "steady, ramp, deploy, host-loss: seconds",
           type=float)
    option("--rate", "RATE", 50.0, "steady, deploy, host-loss: GETs per second", type=float)
    option("--peak-concurrency", "PEAK_CONCURRENCY", 10, "ramp: users at the peak", type=int)
    option("--think-ms", "THINK_MS", 0.0, "ramp: a user's pause between GETs", type=float)
    option("--user-rate", "USER_RATE", 5.0, "GETs per second one user sends", type=float)
    option("--max-error-rate", "MAX_ERROR_RATE", 0.0, "SLO: errors / requests", type=float)
    option("--warm-p99-ms", "WARM_P99_MS", 1000.0, "SLO: p99 of warm requests", type=float)
    option("--hold-p99-ms", "HOLD_P99_MS", 5000.0, "SLO: p99 of hold times", type=float)
    option("--cold-p99-ms", "COLD_P99_MS", 6000.0, "SLO: p99 of cold requests", type=float)
    option("--samples-csv", "SAMPLES_CSV", "", "write every answer's metrics here (k6's "
           "CSV columns, for thaw's load-test report)")
    option("--summary-json", "SUMMARY_JSON", "", "write the verdict here (k6's "
           "--summary-export shape)")


class Run:
    """This process's tally, samples file and burst progress."""

    tally = Tally()
    samples: Any = None  # csv.writer
    samples_file: Any = None
    users = 0  # users started so far: wake-herd gives user i app i mod len(hosts)
    began = 0.0  # time.monotonic() when the test started, and when it stopped
    ended = 0.0


@events.test_stop.add_listener
def note_the_end(**_: Any) -> None:
    Run.ended = time.monotonic()


@events.test_start.add_listener
def open_samples(environment: Environment, **_: Any) -> None:
    Run.began = time.monotonic()
    path = environment.parsed_options.samples_csv
    if path:
        Run.samples_file = open(path, "w", newline="")  # noqa: SIM115 (closed on quitting)
        Run.samples = csv.writer(Run.samples_file)
        Run.samples.writerow(SAMPLE_COLUMNS)


def record(status: int, duration_ms: float, timing: dict[str, float]) -> None:
    Run.tally.record(status, duration_ms, timing)
    if Run.samples is None:
        return
    now = f"{time.time() * 1000:.0f}"
    error = 0 if 200 <= status <= 299 else 1
    rows = [("http_reqs", 1), ("http_req_duration", duration_ms), ("errors", error)]
    if "hold" in timing:
        rows += [("cold_ms", duration_ms), ("cold_requests", 1)]
        rows += [(f"{phase}_ms", ms) for phase, ms in timing.items()]
    else:
        rows.append(("warm_ms", duration_ms))
    Run.samples.writerows((name, now, f"{value:.3f}", status) for name, value in rows)


class EdgeUser(FastHttpUser):
    """GETs through the edge with the app's Host header."""

    network_timeout = 60.0
    connection_timeout = 10.0

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.options = options
        self.burst = options.scenario in BURSTS
        hosts = [h.strip() for h in options.app_hosts.split(",") if h.strip()]
        hosts = hosts if options.scenario == "wake-herd" and hosts else [options.app_host]
        self.host_header = hosts[Run.users % len(hosts)]
        Run.users += 1
        self.done = False
        self.pacing = constant_pacing(1.0 / max(options.user_rate, 0.001))

    def wait_time(self) -> float:
        if self.burst:
            return 3600.0  # one GET each; the shape ends the run once all have answered
        if self.options.scenario == "ramp":
            return float(self.options.think_ms) / 1000.0
        return self.pacing(self)

    @task
    def get(self) -> None:
        if self.done:
            return
        self.done = self.burst
        began = time.perf_counter()
        with self.client.get(self.options.url_path, headers={"Host": self.host_header},
                             name=f"{self.host_header}{self.options.url_path}",
                             catch_response=True) as response:
            duration_ms = (time.perf_counter() - began) * 1000.0
            status = int(response.status_code or 0)
            timing = server_timing(response.headers.get("Server-Timing") if status else None)
            record(status, duration_ms, timing)
            if 200 <= status <= 299:
                response.success()
            else:
                response.failure(f"HTTP {status}" if status else "no answer")


class ThawShape(LoadTestShape):
    """Users over time for the chosen scenario: (users, spawn rate), or None to stop."""

    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options
        now = self.get_run_time()
        if options.scenario in BURSTS:
            done = Run.tally.requests >= options.requests
            return None if done or now > BURST_TIMEOUT_S else (options.requests,
                                                               options.requests)
        if now >= options.duration_s:
            return None
        if options.scenario == "ramp":
            users = round(ramp_level(now, options.duration_s, options.peak_concurrency))
            return users, max(users, 1)
        users = max(1, math.ceil(options.rate / max(options.user_rate, 0.001)))
        return users, users


def ramp_level(now_s: float, duration_s: float, peak: float) -> float:
    """The ramp's concurrency at `now_s`, staged as loadtests/k6/ramp.js stages its VUs:
    1 → peak over 40% of the run, the peak for 20%, back to 0 over the last 40%."""
    up, top = duration_s * 0.4, duration_s * 0.2
    if now_s < up:
        return 1 + (peak - 1) * now_s / up
    if now_s < up + top:
        return peak
    return max(0.0, peak * (duration_s - now_s) / max(duration_s - up - top, 0.001))


@events.quitting.add_listener
def check_slo(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    slo = Slo(max_error_rate=options.max_error_rate, warm_p99_ms=options.warm_p99_ms,
              hold_p99_ms=options.hold_p99_ms, cold_p99_ms=options.cold_p99_ms,
              cold_expected=options.scenario in BURSTS)
    verdicts = evaluate(Run.tally, slo)
    if Run.samples_file is not None:
        Run.samples_file.close()
    if options.summary_json:
        with open(options.summary_json, "w") as out:
            run_s = (Run.ended or time.monotonic()) - Run.began
            json.dump(summary_export(Run.tally, verdicts, run_s), out, indent=1)
    print(f"thaw SLOs ({Run.tally.requests} requests, {Run.tally.errors} errors, "
          f"{len(Run.tally.cold_ms)} cold):", *verdict_lines(verdicts), sep="\n  ", flush=True)
    environment.process_exit_code = 0 if all(v.ok for v in verdicts) else 1
