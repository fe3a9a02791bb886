"""The load-test kit's pure parts: Server-Timing, percentiles and SLO verdicts (Locust's
side), the report's parsing, bins, summary and table, the driver's flags, and the
choice of the host to kill."""

from __future__ import annotations

import argparse
import gzip
from collections.abc import Sequence
from pathlib import Path

import pytest

from loadtests.kit.hostkill import choose_victim, listening_inodes
from loadtests.kit.report import (
    Event,
    MachineCount,
    Point,
    Threshold,
    bin_width_s,
    bins,
    machines_in,
    parse_machines,
    parse_points,
    parse_thresholds,
    read_points,
    report_markdown,
    summarize,
    summary_table,
)
from loadtests.kit.sampler import MachineSampler
from loadtests.kit.scenarios import SCENARIOS, merged, revert_patch
from loadtests.kit.tools import tool_env
from loadtests.locust.slo import (
    Slo,
    Tally,
    evaluate,
    percentile,
    server_timing,
    summary_export,
)
from thaw.loadtest import SCENARIO_NAMES, add_parser, parse_duration

K6_HEADER = ("metric_name,timestamp,metric_value,error_code,expected_response,scenario,status,"
             "extra_tags,metadata")


def k6_csv(rows: Sequence[tuple[str, float, float]]) -> list[str]:
    return [K6_HEADER, *(f"{m},{t:.0f},{v:.6f},,true,s,200,," for m, t, v in rows)]


# -- Server-Timing, percentiles, verdicts ----------------------------------------------------


def test_server_timing_reads_every_phase_in_milliseconds() -> None:
    header = "hold;dur=12.5, place;dur=3.0, pull;dur=0.0, boot;dur=8.1"
    assert server_timing(header) == {"hold": 12.5, "place": 3.0, "pull": 0.0, "boot": 8.1}


@pytest.mark.parametrize("header", [None, "", "hold", "hold;desc=x", "hold;dur=abc"])
def test_server_timing_without_a_readable_duration_says_nothing(header: str | None) -> None:
    assert server_timing(header) == {}


def test_percentile_interpolates_between_ranks_as_k6_does() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 99) == 0.0


def test_a_run_with_a_non_2xx_answer_fails_the_zero_errors_slo() -> None:
    tally = Tally()
    tally.record(200, 5.0, {})
    tally.record(0, 30_000.0, {})  # no answer at all
    verdicts = {v.metric: v for v in evaluate(tally, Slo())}
    assert tally.errors == 1 and not verdicts["errors"].ok
    assert verdicts["warm_ms"].ok is False  # the timed-out request is warm and slow


def test_held_requests_feed_hold_and_cold_and_the_others_warm() -> None:
    tally = Tally()
    tally.record(200, 150.0, {"hold": 120.0, "place": 3.0, "pull": 0.0, "boot": 100.0})
    tally.record(200, 2.0, {})
    assert tally.cold_ms == [150.0] and tally.hold_ms == [120.0] and tally.warm_ms == [2.0]
    verdicts = {v.metric: v for v in evaluate(tally, Slo(hold_p99_ms=100, cold_expected=True))}
    assert not verdicts["hold_ms"].ok and verdicts["cold_ms"].ok
    assert verdicts["cold_requests"].ok


def test_a_cold_scenario_that_saw_no_cold_request_fails() -> None:
    tally = Tally()
    tally.record(200, 2.0, {})
    verdicts = {v.metric: v for v in evaluate(tally, Slo(cold_expected=True))}
    assert not verdicts["cold_requests"].ok


def test_locust_verdicts_read_back_like_k6_summary_export() -> None:
    tally = Tally()
    tally.record(200, 150.0, {"hold": 120.0})
    verdicts = evaluate(tally, Slo(hold_p99_ms=100))
    export = summary_export(tally, verdicts, 0.5)
    read = {(t.metric, t.expression): t.ok for t in parse_thresholds(export)}
    assert read == {(v.metric, v.expression): v.ok for v in verdicts}
    assert read[("hold_ms", "p(99)<100")] is False
    assert export["metrics"]["http_reqs"] == {"count": 1, "rate": 2.0}  # as k6 gives it


def test_k6_summary_export_says_true_for_a_crossed_threshold() -> None:
    export = {"metrics": {"hold_ms": {"p(99)": 9.0, "thresholds": {"p(99)<5": True}},
                          "errors": {"value": 0, "thresholds": {"rate<=0": False}},
                          "http_reqs": {"count": 3}}}
    assert parse_thresholds(export) == [Threshold("errors", "rate<=0", True),
                                        Threshold("hold_ms", "p(99)<5", False)]


# -- points, bins, summary ------------------------------------------------------------------


def test_points_keep_the_reports_metrics_and_skip_the_rest_and_bad_rows() -> None:
    rows = [("http_req_duration", 1000, 5.0), ("http_req_blocked", 1000, 1.0),
            ("hold_ms", 1001, 40.0)]
    lines = [*k6_csv(rows), "http_req_duration,notatime,1,,,,,,"]
    points = parse_points(lines)
    assert points["http_req_duration"] == [Point(1000.0, 5.0)]
    assert points["hold_ms"] == [Point(1001.0, 40.0)]
    assert "http_req_blocked" not in points


def test_gzipped_points_read_like_plain_ones_and_a_missing_file_is_no_points(
    tmp_path: Path,
) -> None:
    path = tmp_path / "points.csv.gz"
    path.write_bytes(gzip.compress("\n".join(k6_csv([("errors", 5, 1.0)])).encode()))
    assert read_points(path)["errors"] == [Point(5.0, 1.0)]
    assert read_points(tmp_path / "absent.csv") == parse_points([])


def test_bins_count_requests_errors_and_cold_per_bin_with_empty_bins_kept() -> None:
    points = parse_points(k6_csv([
        ("http_req_duration", 10_000, 1.0), ("http_req_duration", 10_400, 3.0),
        ("errors", 10_400, 1.0), ("errors", 10_000, 0.0),
        ("http_req_duration", 12_100, 100.0), ("cold_ms", 12_100, 100.0),
    ]))
    series = bins(points, origin_ms=10_000, width_s=1.0)
    assert [b.requests for b in series] == [2, 0, 1]
    assert [b.errors for b in series] == [1, 0, 0]
    assert [b.cold for b in series] == [0, 0, 1]
    assert series[0].p50_ms == pytest.approx(2.0) and series[2].start_s == 2.0


@pytest.mark.parametrize(("span_s", "width_s"), [(1.5, 0.1), (30, 0.5), (60, 1.0),
                                                 (200, 5.0), (10_000, 60.0)])
def test_bins_are_round_widths_giving_about_sixty_bins(span_s: float, width_s: float) -> None:
    assert bin_width_s(span_s) == width_s


def test_machines_are_summed_over_apps_per_sampling_round() -> None:
    samples = parse_machines([
        "timestamp_ms,app,state,count", "1000,a,started,1", "1000,b,started,2",
        "1000,b,stopped,1", "1500,a,started,0", "1500,b,created,1",
    ])
    assert machines_in(samples, "started") == [(1000.0, 3), (1500.0, 0)]
    assert machines_in(samples, "stopped", "created") == [(1000.0, 1), (1500.0, 1)]


def test_without_the_tools_summary_figures_come_from_the_points_over_the_load() -> None:
    points = parse_points(k6_csv(
        [("http_req_duration", 1000 + i * 10, float(i)) for i in range(101)]
        + [("hold_ms", 1000, 50.0), ("cold_ms", 1000, 80.0), ("errors", 1000, 0.0)]))
    machines = [MachineCount(1000, "a", "started", 2), MachineCount(1500, "a", "started", 4)]
    summary = summarize("steady", "k6", points, machines, {}, 4.0)
    assert summary.requests == 101 and summary.errors == 0
    assert summary.rps == pytest.approx(101 / 4.0)  # over the load, not the answers' span
    assert summary.p99_ms == pytest.approx(99.0) and summary.p50_ms == pytest.approx(50.0)
    assert (summary.hold_p99_ms, summary.cold_p99_ms, summary.cold) == (50.0, 80.0, 1)
    assert summary.machines_max == 4 and summary.passed


def test_the_tools_own_summary_is_the_reports_figures() -> None:
    points = parse_points(k6_csv([("http_req_duration", 1000, 5.0)]))
    export = {"metrics": {
        "http_reqs": {"count": 438, "rate": 43.8},
        "errors": {"passes": 2, "fails": 436, "value": 2 / 438,
                   "thresholds": {"rate<=0": True}},
        "http_req_duration": {"med": 3.5, "p(95)": 9.25, "p(99)": 12.0},
        "hold_ms": {"p(99)": 700.0}, "cold_ms": {"p(99)": 710.0},
        "cold_requests": {"count": 7}}}
    summary = summarize("cold-burst", "k6", points, [], export, 1.0)
    assert (summary.requests, summary.rps, summary.errors, summary.cold) == (438, 43.8, 2, 7)
    assert (summary.p50_ms, summary.p95_ms, summary.p99_ms) == (3.5, 9.25, 12.0)
    assert (summary.hold_p99_ms, summary.cold_p99_ms) == (700.0, 710.0)
    assert summary.thresholds == (Threshold("errors", "rate<=0", False),)
    assert "| 438 | 2 | 43.8 | 3.5 | 9.2 | 12.0 | 7 | 700.0 | 710.0 |" in summary_table(summary)


def test_the_table_says_fail_for_a_failed_threshold_and_lists_each() -> None:
    export = {"metrics": {"errors": {"thresholds": {"rate<=0": False}},
                          "hold_ms": {"thresholds": {"p(99)<5": True}}}}
    summary = summarize("cold-burst", "locust", parse_points([]), [], export, 0.0)
    table = summary_table(summary)
    assert "| cold-burst | locust | 0 | 0 |" in table and table.splitlines()[2].endswith(
        "| FAIL |")
    assert "| `hold_ms: p(99)<5` | FAIL |" in table and "| `errors: rate<=0` | pass |" in table
    doc = report_markdown(summary, "thaw loadtest cold-burst", [Event(3500, "load ends")],
                          1000, {"RATE": "5"}, 99)
    assert "| 2.5 | load ends |" in doc and "RATE=5" in doc and "Exit status 99" in doc


# -- the sampler -----------------------------------------------------------------------------


class FakeApi:
    def __init__(self) -> None:
        self.fleet = {"a": [{"state": "started"}, {"state": "destroyed"}], "b": []}

    def machines(self, app: str) -> list[dict[str, object]]:
        if app == "down":
            raise OSError("its worker is gone")
        return self.fleet[app]  # type: ignore[return-value]


def test_a_sampling_round_counts_states_skips_failing_apps_and_records_no_machine(
    tmp_path: Path,
) -> None:
    sampler = MachineSampler(FakeApi(), ["a", "b", "down"], tmp_path / "m.csv",
                             clock=lambda: 2.0)
    (tmp_path / "m.csv").write_text("timestamp_ms,app,state,count\n")
    rows = sampler.sample_once()
    assert rows == [MachineCount(2000.0, "a", "started", 1),
                    MachineCount(2000.0, "b", "started", 0)]
    assert sampler.started_now() == 1
    assert parse_machines((tmp_path / "m.csv").read_text().splitlines()) == rows


class Fleet:
    """Machines by app as placement lists them, changed by the test between rounds."""

    def __init__(self) -> None:
        self.fleet: dict[str, list[dict[str, object]]] = {"a": [], "b": []}
        self.down: set[str] = set()

    def machines(self, app: str) -> list[dict[str, object]]:
        if app in self.down:
            raise OSError("its worker is gone")
        return self.fleet[app]


def test_a_machine_is_counted_from_when_it_changed_state_not_from_the_next_round(
    tmp_path: Path,
) -> None:
    now = [1.0]
    api = Fleet()
    sampler = MachineSampler(api, ["a", "b"], tmp_path / "m.csv", clock=lambda: now[0])
    (tmp_path / "m.csv").write_text("timestamp_ms,app,state,count\n")
    assert sampler.sample_once() == [MachineCount(1000.0, "a", "started", 0),
                                     MachineCount(1000.0, "b", "started", 0)]
    # between the rounds: a's machine started at 1.2 s, b's was created at 1.3 s
    api.fleet["a"] = [{"id": "m1", "state": "started", "updated_at": 1.2}]
    api.fleet["b"] = [{"id": "m2", "state": "created", "updated_at": 1.3}]
    now[0] = 1.5
    assert machines_in(sampler.sample_once(), "started") == [
        (1200.0, 1), (1300.0, 1), (1500.0, 1)]
    assert machines_in(sampler.samples, "created") == [
        (1000.0, 0), (1200.0, 0), (1300.0, 1), (1500.0, 1)]
    # a stamp outside the rounds (another host's clock) is kept within them; a machine
    # no longer listed is gone at the round; an app that fails to list keeps its counts
    api.fleet["a"] = [{"id": "m1", "state": "started", "updated_at": 1.2},
                      {"id": "m3", "state": "started", "updated_at": 9.0}]
    api.fleet["b"] = []
    now[0] = 2.0
    assert machines_in(sampler.sample_once(), "started") == [(2000.0, 2)]
    api.down.add("a")
    now[0] = 2.5
    assert machines_in(sampler.sample_once(), "started") == [(2500.0, 2)]
    assert sampler.started_now() == 2
    assert parse_machines((tmp_path / "m.csv").read_text().splitlines()) == sampler.samples


# -- scenarios and the driver's flags --------------------------------------------------------


def test_a_scenario_field_is_put_back_whole_after_the_run() -> None:
    config = {"concurrency": {"type": "requests", "soft_limit": 20, "hard_limit": 25},
              "max_machines": 3}
    fields = merged(SCENARIOS["ramp"].sets, {"concurrency": {"soft_limit": 4}})
    assert fields["concurrency"] == {"type": "requests", "soft_limit": 4, "hard_limit": 3}
    undo = revert_patch(config, fields)
    assert undo["concurrency"] == config["concurrency"] and undo["max_machines"] == 3
    assert undo["idle_timeout_s"] is None  # absent before: the merge patch removes it


def test_every_scenario_has_its_k6_script_and_the_locustfile_names_it() -> None:
    root = Path(__file__).resolve().parents[2] / "loadtests"
    locustfile = (root / "locust" / "locustfile.py").read_text()
    assert set(SCENARIOS) == set(SCENARIO_NAMES)
    for name, scenario in SCENARIOS.items():
        assert (root / "k6" / scenario.k6_script).exists()
        assert f'"{name}"' in locustfile


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30.0), ("2m", 120.0), ("90", 90.0),
                                                ("500ms", 0.5), ("1.5h", 5400.0)])
def test_durations_read_like_k6s(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "-1s", "ten", "3 days"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="thaw")
    add_parser(top.add_subparsers(dest="command"))
    return top


def test_loadtest_has_a_description_and_every_flag_a_help_line() -> None:
    top = parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    loadtest = sub.choices["loadtest"]
    assert loadtest.description
    assert all(action.help for action in loadtest._actions)


def test_the_tools_get_the_scenario_and_its_slos_in_their_environment(tmp_path: Path) -> None:
    args = parser().parse_args(["loadtest", "ramp", "--duration", "1m", "--hold-p99-ms", "250",
                                "--base-url", "http://10.0.0.5:8080"])
    env = tool_env(args, "hello.example.com", ["hello.example.com"], tmp_path)
    assert env["DURATION_S"] == "60" and env["HOLD_P99_MS"] == "250"
    assert env["BASE_URL"] == "http://10.0.0.5:8080" and env["APP_HOST"] == "hello.example.com"
    assert env["SCENARIO"] == "ramp" and env["K6_NO_USAGE_REPORT"] == "true"


# -- the host to kill ------------------------------------------------------------------------

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1
   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4343 1
   2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1
"""


def test_only_the_listening_socket_of_the_port_is_found() -> None:
    assert listening_inodes([PROC_NET_TCP], 8080) == {"4242"}
    assert listening_inodes([PROC_NET_TCP], 9999) == set()


def test_the_victim_is_the_worker_of_the_apps_started_machine_with_all_its_machines() -> None:
    workers = [{"id": "w0", "url": "http://127.0.0.1:7000"},
               {"id": "w1", "url": "http://127.0.0.1:7001"}]
    machines = {
        "hello": [{"id": "m1", "worker": "w0", "state": "stopped", "pid": 0},
                  {"id": "m2", "worker": "w1", "state": "started", "pid": 42}],
        "other": [{"id": "m3", "worker": "w1", "state": "started", "pid": 43}],
    }
    victim = choose_victim("hello", workers, machines)
    assert (victim.worker, victim.url) == ("w1", "http://127.0.0.1:7001")
    assert victim.machine_pids == (42, 43) and victim.machine_ids == ("m2", "m3")
    assert choose_victim("hello", workers, machines, worker="w0").machine_ids == ("m1",)
    with pytest.raises(ValueError, match="no started machine"):
        choose_victim("other2", workers, machines)


@pytest.fixture
def no_platform_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Contexts of the test's own, and no THAW_ variable saying which platform."""
    monkeypatch.setenv("THAW_CONFIG", str(tmp_path / "cfg"))
    for name in ("API_URL", "EDGE_URL", "TOKEN", "CONTEXT"):
        monkeypatch.delenv(f"THAW_{name}", raising=False)


def kit_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="thaw")
    add_parser(top.add_subparsers(dest="command"))
    return top


@pytest.mark.usefixtures("no_platform_env")
def test_the_kit_finds_the_platform_by_its_context_as_the_cli_does(tmp_path: Path) -> None:
    from thaw import contexts
    from thaw.loadtest import edge_of, find_platform

    top = kit_parser()
    given = top.parse_args(["loadtest", "steady"])
    find_platform(given)  # no context: make up's defaults
    assert (given.api, given.base_url, given.domain) == (
        "http://127.0.0.1:4280", "http://127.0.0.1:8080", "localhost")
    token = tmp_path / "admin.token"
    token.write_text("t0k\n")
    contexts.put("local", contexts.Context(api="http://127.0.0.1:4281", token_file=str(token),
                                           app_url="http://{app}.localhost:8081/"))
    found = top.parse_args(["loadtest", "steady"])
    find_platform(found)  # thaw up on its own ports: found with no flag
    assert (found.api, found.token, found.base_url, found.domain) == (
        "http://127.0.0.1:4281", "t0k", "http://127.0.0.1:8081", "localhost")
    mine = top.parse_args(["loadtest", "steady", "--api", "10.0.0.6:4280"])
    find_platform(mine)  # an --api of its own: no context, never its token
    assert (mine.api, mine.token) == ("10.0.0.6:4280", "")
    assert edge_of("http://{app}.apps.example:8000/", "web") == (
        "http://web.apps.example:8000", "apps.example")
    assert edge_of("https://{app}.localhost:8443/", "web") == (
        "http://127.0.0.1:8080", "localhost")  # HTTPS: the defaults (pass --base-url)


@pytest.mark.usefixtures("no_platform_env")
def test_a_remote_current_context_is_loaded_only_when_named(tmp_path: Path) -> None:
    from thaw import contexts
    from thaw.loadtest import find_platform

    ca = tmp_path / "ca.pem"
    contexts.put("prod", contexts.Context(api="https://api.example:443", cacert=str(ca)))
    top = kit_parser()
    with pytest.raises(ValueError, match=r"not on this host.*--context prod"):
        find_platform(top.parse_args(["loadtest", "steady"]))
    named = top.parse_args(["loadtest", "steady", "--context", "prod"])
    find_platform(named)
    assert (named.api, named.cacert) == ("https://api.example:443", str(ca))


def test_a_change_stamped_before_the_last_round_never_doubles_that_rounds_rows(
    tmp_path: Path,
) -> None:
    now = [100.0]
    api = Fleet()
    api.fleet = {"a": [{"id": "a1", "state": "started", "updated_at": 99.0}],
                 "b": [{"id": "b1", "state": "started", "updated_at": 99.0}]}
    sampler = MachineSampler(api, ["a", "b"], tmp_path / "m.csv", clock=lambda: now[0])
    (tmp_path / "m.csv").write_text("timestamp_ms,app,state,count\n")
    sampler.sample_once()
    api.down.add("a")  # round 2 cannot list a
    now[0] = 101.0
    sampler.sample_once()
    api.down.clear()  # round 3: a second machine of a, started at 100.8 (before round 2)
    api.fleet["a"].append({"id": "a2", "state": "started", "updated_at": 100.8})
    api.fleet["b"].append({"id": "b2", "state": "started"})  # no stamp at all
    now[0] = 102.0
    sampler.sample_once()
    assert machines_in(sampler.samples, "started") == [
        (100000.0, 2), (101000.0, 2), (102000.0, 4)]
