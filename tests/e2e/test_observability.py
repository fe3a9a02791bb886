"""Observability of `thaw up` as an operator sees it: a real Prometheus scraping it through
the shipped config, every query of the shipped Grafana dashboard, the access log,
/readyz, and an app's series leaving /metrics with the app."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.agent_process import call, kill_group, wait_until
from tests.support.platform import ThawUp
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "thaw.json"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
# What Grafana puts in place of its variables when every app is chosen.
VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s", "$app": ".*"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThawUp]:
    # every warm answer logged (`thaw up` samples one in a hundred by default)
    platform = ThawUp(tmp_path_factory.mktemp("thaw"), hello=["idle_timeout_s=2"],
                      extra=["--access-log-sample", "1"]).start()
    try:
        yield platform
    finally:
        platform.cleanup()


@pytest.fixture(scope="module")
def prometheus(up: ThawUp, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus on a free port, scraping `thaw up` every second through the shipped
    config (its file_sd pointed at this run's targets file); killed by its PID after."""
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    work = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    for job in config["scrape_configs"]:
        for sd in job["file_sd_configs"]:
            sd["files"] = [str(up.state_dir / "prometheus-targets.json")]
            sd["refresh_interval"] = "1s"
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(work / "prometheus.log", "wb")  # noqa: SIM115 (closed after the process)
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or _status(f"{url}/-/ready") == 200, 30, 0.2)
        assert proc.poll() is None, (work / "prometheus.log").read_text()
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


# -- helpers -------------------------------------------------------------------------------


def _status(url: str) -> int:
    try:
        return call("GET", url, signed=False, timeout_s=2)[0]
    except OSError:
        return 0


def edge_get(up: ThawUp, host: str, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", up.edge_port, timeout=30)
    try:
        conn.request("GET", "/", headers={"Host": host, **(headers or {})})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def metrics_text(url: str) -> str:
    status, body = call("GET", f"{url}/metrics", signed=False)
    assert status == 200
    return str(body)


def targets(up: ThawUp) -> list[dict[str, Any]]:
    return list(json.loads((up.state_dir / "prometheus-targets.json").read_text()))


def service_urls(up: ThawUp, service: str) -> list[str]:
    return [f"http://{group['targets'][0]}" for group in targets(up)
            if group["labels"]["service"] == service]


def create_app(up: ThawUp, name: str, **fields: Any) -> None:
    status, hello = call("GET", f"{up.api}/v1/apps/hello", token=up.token)
    assert status == 200, hello
    status, body = call("POST", f"{up.api}/v1/apps", {
        "name": name, "image": hello["image"], "health": {"path": "/healthz", "timeout_s": 10},
        **fields}, token=up.token)
    assert status == 201, body


def machines(up: ThawUp, app: str) -> list[dict[str, Any]]:
    status, body = call("GET", f"{up.api}/v1/apps/{app}/machines", token=up.token)
    assert status == 200, body
    return [m for m in body if m["state"] != "destroyed"]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, variables filled in."""
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name in sorted(VARIABLES, key=len, reverse=True):
                expr = expr.replace(name, VARIABLES[name])
            assert "$" not in expr, f"a variable the test does not fill in: {expr}"
            found.append((panel["title"], expr))
    return found


def query(prometheus: str, expr: str) -> dict[str, Any]:
    status, body = call("GET", f"{prometheus}/api/v1/query?" +
                        urllib.parse.urlencode({"query": expr}), signed=False)
    assert status == 200, (expr, body)
    return dict(body)


def drive_traffic(up: ThawUp) -> None:
    """Cause what every panel shows: a cold start, warm requests, a 404, an auto-stop,
    a 504, a wake of a stopped machine, a reconciler action, a failed connect."""
    assert edge_get(up, "hello.localhost") == 200  # cold: placed, pulled, booted
    for _ in range(20):
        assert edge_get(up, "hello.localhost") == 200  # warm
    assert edge_get(up, "nobody.localhost") == 404
    create_app(up, "steady", min_machines_running=1, idle_timeout_s=60)  # the reconciler
    wait_until(lambda: [m["state"] for m in machines(up, "hello")] == ["stopped"], 30, 0.2)
    # held 1 ms at most while the stopped machine is woken: 504 hold_timeout
    assert edge_get(up, "hello.localhost", {"X-Thaw-Hold-Timeout-Ms": "1"}) == 504
    assert edge_get(up, "hello.localhost") == 200
    # a machine killed under the edge: its next connect fails (counted), the request goes on
    started = [m for m in machines(up, "hello") if m["state"] == "started" and m["pid"]]
    assert started, machines(up, "hello")
    kill_group(started[0]["pid"])
    edge = f"http://127.0.0.1:{up.admin_port}"

    def connect_failed() -> bool:
        edge_get(up, "hello.localhost")
        return "thaw_edge_upstream_connect_errors_total{" in metrics_text(edge)

    wait_until(connect_failed, 30, 0.2)


# -- tests ---------------------------------------------------------------------------------


def test_every_query_of_the_grafana_dashboard_returns_series_from_a_real_prometheus(
    up: ThawUp, prometheus: str,
) -> None:
    drive_traffic(up)
    pending = dict.fromkeys(dashboard_queries())
    assert len(pending) >= 20
    deadline = time.monotonic() + 60
    answers: dict[tuple[str, str], Any] = {}
    while pending and time.monotonic() < deadline:
        for key in list(pending):
            answer = query(prometheus, key[1])
            assert answer["status"] == "success", (key, answer)
            answers[key] = answer["data"]["result"]
            if answer["data"]["result"]:
                del pending[key]
        if pending:
            time.sleep(1)
    assert not pending, "queries with no series:\n" + "\n".join(
        f"{title}: {expr}" for title, expr in pending)
    # the template variable's values (label_values) include the apps the test used
    status, values = call("GET", f"{prometheus}/api/v1/label/app/values?" +
                          urllib.parse.urlencode({"match[]": "thaw_edge_requests_total"}),
                          signed=False)
    assert status == 200 and "hello" in values["data"]
    # every service of `thaw up` is a target, and up
    services = query(prometheus, "sum by (service) (up)")["data"]["result"]
    assert {s["metric"]["service"]: s["value"][1] for s in services} == {
        "edge": "1", "placement": "1", "agent": "2"}


def test_the_series_of_a_deleted_app_leave_the_edge_and_placement_metrics(up: ThawUp) -> None:
    create_app(up, "gone", idle_timeout_s=60)
    assert edge_get(up, "gone.localhost") == 200
    edge = f"http://127.0.0.1:{up.admin_port}"
    labelled = re.compile(r'app="gone"')
    [placement] = service_urls(up, "placement")  # its admin listener
    wait_until(lambda: labelled.search(metrics_text(edge)) is not None
               and labelled.search(metrics_text(placement)) is not None, 20, 0.2)
    assert 'thaw_edge_request_duration_seconds_count{app="gone",code_class="2xx"}' in \
        metrics_text(edge)

    status, body = call("DELETE", f"{up.api}/v1/apps/gone", token=up.token)
    assert status == 200, body
    wait_until(lambda: labelled.search(metrics_text(edge)) is None
               and labelled.search(metrics_text(placement)) is None, 20, 0.2)


def test_access_log_lines_of_a_cold_and_a_warm_request_carry_their_fields(up: ThawUp) -> None:
    create_app(up, "logged", idle_timeout_s=60)
    assert edge_get(up, "logged.localhost", {"X-Request-Id": "obs-cold-1"}) == 200
    assert edge_get(up, "logged.localhost", {"X-Request-Id": "obs-warm-1"}) == 200
    log = up.state_dir / "access.log"

    def lines() -> dict[str, dict[str, Any]]:
        if not log.exists():
            return {}
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        return {e["request_id"]: e for e in entries if e["request_id"].startswith("obs-")}

    wait_until(lambda: {"obs-cold-1", "obs-warm-1"} <= set(lines()), 10, 0.1)
    cold, warm = lines()["obs-cold-1"], lines()["obs-warm-1"]
    for entry in (cold, warm):
        assert entry["app"] == "logged" and entry["status"] == 200
        assert entry["method"] == "GET" and entry["host"] == "logged.localhost"
        assert entry["path"] == "/" and entry["proto"] == "http/1.1"
        assert entry["machine"] and entry["worker"].startswith("local-")
        assert entry["bytes_out"] > 0 and entry["bytes_in"] == 0
        assert entry["duration_ms"] > 0 and entry["ts"] > 0 and entry["code"] == ""
    assert cold["machine"] == warm["machine"]
    assert cold["cold"] is True and not warm["cold"]
    for phase in ("hold_ms", "place_ms", "pull_ms", "boot_ms"):
        assert isinstance(cold[phase], float) and phase not in warm
    assert cold["hold_ms"] > 0 and cold["boot_ms"] > 0
    assert cold["duration_ms"] >= cold["hold_ms"]


def test_readyz_answers_ready_on_the_edge_placement_and_every_agent(up: ThawUp) -> None:
    services = {group["labels"]["service"] for group in targets(up)}
    assert services == {"edge", "placement", "agent"}
    agents = service_urls(up, "agent")
    assert len(agents) == 2
    for url in [f"http://127.0.0.1:{up.admin_port}", up.api, *service_urls(up, "placement"),
                *agents]:
        status, body = call("GET", f"{url}/readyz", signed=False)
        assert (status, body) == (200, {"ready": True}), url


def test_placements_metrics_are_not_on_its_public_api_port(up: ThawUp) -> None:
    """They name every tenant's apps and count their machines: the admin listener only."""
    for token in ("", up.token):
        status, _ = call("GET", f"{up.api}/metrics", signed=False, token=token)
        assert status == 404
    [placement] = service_urls(up, "placement")
    assert placement != up.api and "thaw_placement_apps " in metrics_text(placement)
