"""`thaw up --tls` as a user would start it: HTTP/2 with prior knowledge on the plain port,
h2 and HTTP/1.1 by ALPN over TLS with the local CA, and a WebSocket, to a cold app; the
API over HTTPS only with the same CA (the edge's wakes too), its metrics on the admin
listener Prometheus is pointed at."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.agent_process import call, wait_until
from tests.support.platform import ThawUp
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThawUp, int]]:
    tls_port = free_port()
    # ./.thaw, as the quick start has it: the CLI finds the token and the CA there
    platform = ThawUp(tmp_path_factory.mktemp("thaw") / ".thaw",
                      extra=["--tls", "--tls-port", str(tls_port), "--log-level", "info"]).start()
    try:
        yield platform, tls_port
    finally:
        platform.cleanup()


def curl(*args: str, platform: ThawUp | None = None) -> tuple[str, str]:
    """(body, "version status") of one curl call."""
    out = subprocess.run(["curl", "-sS", "--max-time", "30", "-w", "\n%{http_version} %{http_code}",
                          *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (out.stderr, platform.more_output() if platform else "")
    body, _, summary = out.stdout.rpartition("\n")
    return body, summary


def test_the_banner_says_how_to_curl_over_tls(up: tuple[ThawUp, int]) -> None:
    platform, tls_port = up
    assert f"--cacert {platform.state_dir}/tls/ca.pem" in platform.output.decode()
    assert f"https://hello.localhost:{tls_port}/" in platform.output.decode()


def test_the_contexts_app_url_is_the_https_one_and_curl_reaches_the_app_by_it(
    up: tuple[ThawUp, int],
) -> None:
    import json

    platform, tls_port = up
    wait_until(lambda: (platform.cli_config / "contexts.json").exists(), 10)
    local = json.loads((platform.cli_config / "contexts.json").read_text())["contexts"]["local"]
    assert local["app_url"] == f"https://{{app}}.localhost:{tls_port}/"
    url = local["app_url"].replace("{app}", "hello")  # curl sends *.localhost to this host
    body, summary = curl("--cacert", f"{platform.state_dir}/tls/ca.pem", url,
                         platform=platform)
    assert summary.endswith(" 200") and body.startswith("hello from ")


def test_h2c_with_prior_knowledge_wakes_the_cold_app(up: tuple[ThawUp, int]) -> None:
    platform, _ = up
    body, summary = curl("--http2-prior-knowledge", "-H", "Host: hello.localhost",
                         f"{platform.edge}/")
    assert summary == "2 200" and body.startswith("hello from ")


@pytest.mark.parametrize(("flag", "version"), [("--http2", "2"), ("--http1.1", "1.1")])
def test_tls_with_the_local_ca_serves_h2_and_http11_by_alpn(
    up: tuple[ThawUp, int], flag: str, version: str,
) -> None:
    platform, tls_port = up
    body, summary = curl(flag, "--cacert", str(platform.state_dir / "tls" / "ca.pem"),
                         "--resolve", f"hello.localhost:{tls_port}:127.0.0.1",
                         f"https://hello.localhost:{tls_port}/", platform=platform)
    assert summary == f"{version} 200" and body.startswith("hello from ")


def test_a_websocket_echoes_through_thaw_up(up: tuple[ThawUp, int]) -> None:
    platform, _ = up

    async def echo() -> str:
        async with aiohttp.ClientSession() as session, session.ws_connect(
                f"{platform.edge}/ws", headers={"Host": "hello.localhost"}) as ws:
            await ws.send_str("ping over the edge")
            message = await ws.receive(timeout=30)
            return str(message.data)

    assert asyncio.run(echo()) == "ping over the edge"


def test_concurrent_handshakes_for_new_names_all_succeed(up: tuple[ThawUp, int]) -> None:
    """(`thaw up` runs uvloop: its server-side handshakes, 20 at once, each for a name the
    local CA has not made a certificate for yet.)"""
    platform, tls_port = up
    ca = str(platform.state_dir / "tls" / "ca.pem")
    procs = [subprocess.Popen(
        ["curl", "-sS", "--max-time", "30", "-o", "/dev/null", "-w", "%{http_version}",
         "--cacert", ca, "-H", "Host: hello.localhost", "--resolve",
         f"n{i}.localhost:{tls_port}:127.0.0.1", f"https://n{i}.localhost:{tls_port}/"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(20)]
    results = [proc.communicate(timeout=60) for proc in procs]
    assert [out for out, _ in results] == ["2"] * 20, (results, platform.more_output())


def thaw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("THAW_CACERT", "THAW_TOKEN")}
    return subprocess.run([sys.executable, "-m", "thaw", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd, env=env, check=False)


def test_the_api_is_https_only_with_the_local_ca_and_the_banner_says_how_to_curl_it(
    up: tuple[ThawUp, int],
) -> None:
    platform, _ = up
    ca = str(platform.state_dir / "tls" / "ca.pem")
    assert platform.api.startswith("https://127.0.0.1:")
    banner = platform.output.decode()
    assert f"curl --cacert {ca} -H" in banner and f"{platform.api}/v1/apps" in banner
    body, summary = curl("--cacert", ca, "-H", f"Authorization: Bearer {platform.token}",
                         f"{platform.api}/v1/apps", platform=platform)
    assert summary == "1.1 200" and "hello" in [app["name"] for app in json.loads(body)]
    _, summary = curl("--cacert", ca, f"{platform.api}/metrics", platform=platform)
    assert summary == "1.1 404"  # metrics are on the admin listener only
    untrusted = subprocess.run(["curl", "-sS", "--max-time", "10", f"{platform.api}/healthz"],
                               capture_output=True, text=True, timeout=30)
    assert untrusted.returncode == 60, untrusted.stderr  # curl: peer certificate not trusted
    plain = subprocess.run(["curl", "-sS", "--max-time", "10",
                            platform.api.replace("https://", "http://") + "/healthz"],
                           capture_output=True, text=True, timeout=30)
    assert plain.returncode != 0  # no plain HTTP on the API port


def test_the_cli_uses_the_local_ca_in_dot_thaw_and_elsewhere_needs_cacert(
    up: tuple[ThawUp, int], tmp_path: Path,
) -> None:
    platform, _ = up
    here = thaw("apps", "list", "--api", platform.api, "--json", cwd=platform.state_dir.parent)
    assert here.returncode == 0, here.stderr
    assert "hello" in [app["name"] for app in json.loads(here.stdout)]
    elsewhere = thaw("apps", "list", "--api", platform.api, "--token", platform.token,
                     cwd=tmp_path)
    assert elsewhere.returncode == 1 and "certificate not trusted" in elsewhere.stderr
    assert "Traceback" not in elsewhere.stderr
    given = thaw("apps", "list", "--api", platform.api, "--token", platform.token, "--cacert",
                 str(platform.state_dir / "tls" / "ca.pem"), cwd=tmp_path)
    assert given.returncode == 0 and "hello" in given.stdout, given.stderr


def test_prometheus_targets_name_placements_admin_listener_which_serves_its_metrics(
    up: tuple[ThawUp, int],
) -> None:
    platform, _ = up
    groups = json.loads((platform.state_dir / "prometheus-targets.json").read_text())
    [target] = [g["targets"][0] for g in groups if g["labels"]["service"] == "placement"]
    assert target.startswith("127.0.0.1:") and target != f"127.0.0.1:{platform.api_port}"
    status, text = call("GET", f"http://{target}/metrics", signed=False)
    assert status == 200 and "thaw_placement_apps " in str(text)
