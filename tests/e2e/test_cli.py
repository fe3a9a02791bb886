"""The `thaw` CLI against a running `thaw up`, as an app owner would use it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_process import call
from tests.support.platform import ThawUp
from thaw.imagebuild import build_image

pytestmark = [pytest.mark.slow, pytest.mark.integration]

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThawUp]:
    platform = ThawUp(tmp_path_factory.mktemp("thaw"), agents=1).start()
    try:
        yield platform
    finally:
        platform.cleanup()


def thaw(up: ThawUp, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "THAW_TOKEN": up.token if token is None else token}
    return subprocess.run([sys.executable, "-m", "thaw", *args, "--api", up.api],
                          capture_output=True, text=True, timeout=60, check=False, env=env)


def test_deploy_from_thaw_toml_creates_the_app_and_its_running_machine(
    up: ThawUp, tmp_path: Path
) -> None:
    build_image(HELLO, "hello:v2", layout=tmp_path / "layout")
    toml = tmp_path / "thaw.toml"
    toml.write_text(
        'app = "greeter"\n'
        f'image = "oci:{tmp_path / "layout"}:v2"\n'
        "min_machines_running = 1\nmax_machines = 2\n"
        "[guest]\ncpus = 0.25\nmemory_mb = 64\n"
        '[concurrency]\ntype = "requests"\nsoft_limit = 5\nhard_limit = 8\n'
    )
    deployed = thaw(up, "deploy", "-c", str(toml))
    assert deployed.returncode == 0, deployed.stderr
    _, app = call("GET", f"{up.api}/v1/apps/greeter", token=up.token)
    assert app["concurrency"]["soft_limit"] == 5 and app["image_digest"].startswith("sha256:")
    listed = thaw(up, "machines", "list", "greeter")
    assert listed.returncode == 0 and "ID" in listed.stdout
    assert len(listed.stdout.strip().splitlines()) == 2  # header + the running machine
    status = thaw(up, "status")
    assert status.returncode == 0 and "WORKERS" in status.stdout and "APP greeter" in status.stdout

    again = thaw(up, "deploy", "-c", str(toml))  # nothing changed: no release, no version
    assert again.returncode == 0, again.stderr
    _, same = call("GET", f"{up.api}/v1/apps/greeter", token=up.token)
    assert (same["version"], same["release"]) == (app["version"], 1)
    releases = thaw(up, "releases", "greeter")
    assert releases.returncode == 0 and len(releases.stdout.strip().splitlines()) == 2
    events = thaw(up, "events", "greeter")
    assert events.returncode == 0 and "min_machines_running=1" in events.stdout
    rollback = thaw(up, "rollback", "greeter", "1")
    assert rollback.returncode == 1 and "already runs" in rollback.stderr


def test_apps_create_update_and_an_invalid_setting_named_before_anything_is_sent(
    up: ThawUp, tmp_path: Path
) -> None:
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    created = thaw(up, "apps", "create", "owned", "--image", f"oci:{tmp_path / 'layout'}:v1",
                   "--set", "concurrency.soft_limit=4", "--set", "concurrency.hard_limit=6")
    assert created.returncode == 0, created.stderr
    updated = thaw(up, "apps", "update", "owned", "--set", "max_machines=5")
    assert updated.returncode == 0 and '"max_machines": 5' in updated.stdout
    bad = thaw(up, "apps", "create", "broken", "--image", "x",
               "--set", "concurrency.hard_limit=1")
    assert bad.returncode == 2 and "concurrency.hard_limit" in bad.stderr
    assert call("GET", f"{up.api}/v1/apps/broken", token=up.token)[0] == 404
    listed = thaw(up, "apps", "list")
    assert listed.returncode == 0 and "owned" in listed.stdout
    deleted = thaw(up, "apps", "delete", "owned")
    assert deleted.returncode == 0
    assert call("GET", f"{up.api}/v1/apps/owned", token=up.token)[0] == 404


def test_an_unknown_app_is_a_clear_error_not_a_traceback(up: ThawUp) -> None:
    shown = thaw(up, "apps", "show", "nope")
    assert shown.returncode == 1 and "HTTP 404" in shown.stderr and "Traceback" not in shown.stderr
