"""The load-test kit against `thaw up`: k6 and Locust scenarios through `thaw loadtest`,
their thresholds, and the report they leave."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.platform import ThawUp
from thaw.client import ApiClient
from thaw.loadtest import add_parser, run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThawUp]:
    platform = ThawUp(tmp_path_factory.mktemp("thaw"), agents=2).start()
    try:
        yield platform
    finally:
        platform.cleanup()


def loadtest(up: ThawUp, report: Path, *flags: str) -> int:
    """`thaw loadtest …` against `up`, run in this process as the CLI would run it."""
    top = argparse.ArgumentParser(prog="thaw")
    add_parser(top.add_subparsers(dest="command"))
    args = top.parse_args(["loadtest", *flags, "--base-url", up.edge, "--api", up.api,
                           "--token", up.token, "--report", str(report),
                           "--sample-interval", "0.25"])
    return run(args)


# The latency SLOs made loose for a test (a test asserts no wall-clock speed: on a loaded
# 2-core machine one image pull took 5.4 s and crossed the default hold p99 of 5 s); the
# thresholds are still evaluated and reported, and one that cannot hold still fails below.
LOOSE = ("--warm-p99-ms", "30000", "--hold-p99-ms", "60000", "--cold-p99-ms", "60000")


def table_row(report: Path) -> dict[str, str]:
    """The figures of summary.md's table, by column."""
    lines = (report / "summary.md").read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| scenario |"))
    names = [c.strip() for c in lines[header].strip("|").split("|")]
    values = [c.strip() for c in lines[header + 2].strip("|").split("|")]
    return dict(zip(names, values, strict=True))


def assert_the_table_is_the_tools_summary(report: Path) -> dict[str, str]:
    """summary.md's figures are the tool's own (its verdict.json, k6's --summary-export or
    the locustfile's in that shape), and the points plotted are as many as it counted."""
    import json

    from loadtests.kit.report import read_points

    row = table_row(report)
    metrics = json.loads((report / "verdict.json").read_text())["metrics"]
    requests = int(metrics["http_reqs"]["count"])
    assert int(row["requests"].replace(",", "")) == requests
    assert row["req/s"] == f"{metrics['http_reqs']['rate']:,.1f}"
    duration = metrics["http_req_duration"]
    assert [row["p50 ms"], row["p95 ms"], row["p99 ms"]] == [
        f"{duration[stat]:.1f}" for stat in ("med", "p(95)", "p(99)")]
    if "hold_ms" in metrics and "p(99)" in metrics["hold_ms"]:
        assert row["hold p99 ms"] == f"{metrics['hold_ms']['p(99)']:.1f}"
    points = next(report.glob("points.csv.gz"), report / "samples.csv")
    assert len(read_points(points)["http_req_duration"]) == requests
    return row


def test_a_k6_cold_burst_of_200_passes_its_thresholds_and_reports_the_wake(
    up: ThawUp, tmp_path: Path,
) -> None:
    code = loadtest(up, tmp_path, "cold-burst", "--tool", "k6", "--requests", "200", *LOOSE)
    assert code == 0, (tmp_path / "tool.log").read_text()[-3000:]
    row = assert_the_table_is_the_tools_summary(tmp_path)
    assert row["requests"] == "200" and row["errors"] == "0"
    assert int(row["cold"]) > 0 and float(row["hold p99 ms"]) > 0
    assert int(row["machines max"]) >= 1 and row["thresholds"] == "pass"

    png = (tmp_path / "plot.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(tmp_path / "plot.png").shape
    assert width > 800 and height > 600


def test_a_headless_locust_run_passes_its_thresholds(up: ThawUp, tmp_path: Path) -> None:
    code = loadtest(up, tmp_path, "steady", "--tool", "locust", "--duration", "10s",
                    "--rate", "20", *LOOSE)
    assert code == 0, (tmp_path / "tool.log").read_text()[-3000:]
    row = assert_the_table_is_the_tools_summary(tmp_path)
    assert 150 <= int(row["requests"].replace(",", "")) <= 230 and row["errors"] == "0"
    # and Locust's own stats count the same GETs
    import csv

    with open(tmp_path / "locust_stats.csv", newline="") as stats:
        total = next(r for r in csv.DictReader(stats) if r["Name"] == "Aggregated")
    assert total["Request Count"] == row["requests"].replace(",", "")
    assert (tmp_path / "plot.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(("tool", "code"), [("k6", 99), ("locust", 1)])
def test_a_threshold_that_cannot_hold_makes_the_run_exit_non_zero(
    up: ThawUp, tmp_path: Path, tool: str, code: int,
) -> None:
    assert loadtest(up, tmp_path, "steady", "--tool", tool, "--duration", "3s", "--rate",
                    "10", "--warm-p99-ms", "0.001") == code
    assert "| `warm_ms: p(99)<0.001` | FAIL |" in (tmp_path / "summary.md").read_text()


def test_fields_a_scenario_sets_on_the_app_are_put_back_after_it(
    up: ThawUp, tmp_path: Path,
) -> None:
    api = ApiClient(up.api, up.token)
    before = api.get("/v1/apps/hello")
    assert loadtest(up, tmp_path, "ramp", "--duration", "3s", "--peak-concurrency", "2",
                    "--think-ms", "20", "--settle", "1s", *LOOSE) == 0
    after = api.get("/v1/apps/hello")
    for field in ("concurrency", "max_machines", "idle_timeout_s"):
        assert after[field] == before[field]


def test_host_loss_kills_a_separate_agent_under_load_and_no_request_fails(
    tmp_path: Path,
) -> None:
    from loadtests.kit.separate import SeparatePlatform

    platform = SeparatePlatform(tmp_path / "platform", agents=2).start()
    try:
        top = argparse.ArgumentParser(prog="thaw")
        add_parser(top.add_subparsers(dest="command"))
        args = top.parse_args([
            "loadtest", "host-loss", "--duration", "8s", "--rate", "20", "--action-at", "3s",
            "--settle", "1s", *LOOSE, "--base-url", platform.edge, "--api", platform.api,
            "--token", platform.token, "--report", str(tmp_path / "report")])
        code = run(args)
        report = tmp_path / "report"
        assert code == 0, (report / "tool.log").read_text()[-3000:]
        assert table_row(report)["errors"] == "0"
        assert "killed |" in (report / "summary.md").read_text()
        assert sum(proc.poll() is not None for proc in platform.procs.values()) == 1
    finally:
        platform.stop()
