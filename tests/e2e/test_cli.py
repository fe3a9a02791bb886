"""The `thaw` CLI against a running `thaw up`, as an app owner would use it."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_process import call, wait_until
from tests.support.platform import ThawUp
from tests.support.ports import free_port
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
    env.pop("COLUMNS", None)  # tables 100 wide (not a terminal)
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
    assert status.returncode == 0 and "WORKERS" in status.stdout and "greeter" in status.stdout
    assert max(len(line) for line in status.stdout.splitlines()) <= 100

    again = thaw(up, "deploy", "-c", str(toml))  # nothing changed: no release, no version
    assert again.returncode == 0, again.stderr
    _, same = call("GET", f"{up.api}/v1/apps/greeter", token=up.token)
    assert (same["version"], same["release"]) == (app["version"], 1)
    releases = thaw(up, "releases", "greeter")
    rows = [line for line in releases.stdout.strip().splitlines() if not line.startswith(" ")]
    assert releases.returncode == 0 and len(rows) == 2  # header + release 1 (reasons below)
    events = thaw(up, "events", "greeter")
    assert events.returncode == 0 and "min_machines_running=1" in events.stdout
    rollback = thaw(up, "rollback", "greeter", "1")
    assert rollback.returncode == 1 and "already runs" in rollback.stderr

    toml.write_text(toml.read_text() + '[env]\nGREETING = "v2"\n')
    second = thaw(up, "deploy", "-c", str(toml))  # followed: release 2 complete
    assert second.returncode == 0 and "complete: 1 of 1 machines on release 2" in second.stdout
    back = thaw(up, "rollback", "greeter", "1")  # followed as a deploy is
    assert back.returncode == 0, back.stdout + back.stderr
    assert "(from release 1, replacing 2)" in back.stdout
    assert "complete: 1 of 1 machines on release 3" in back.stdout, back.stdout
    _, rolled = call("GET", f"{up.api}/v1/apps/greeter/releases", token=up.token)
    assert [r["status"] for r in rolled] == ["complete", "rolled_back", "complete"]
    detached = thaw(up, "rollback", "greeter", "2", "--detach")
    assert detached.returncode == 0 and detached.stdout.strip().endswith("pending")


def test_apps_create_update_and_an_invalid_setting_named_before_anything_is_sent(
    up: ThawUp, tmp_path: Path
) -> None:
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    created = thaw(up, "apps", "create", "owned", "--image", f"oci:{tmp_path / 'layout'}:v1",
                   "--set", "concurrency.soft_limit=4", "--set", "concurrency.hard_limit=6")
    assert created.returncode == 0, created.stderr
    updated = thaw(up, "apps", "update", "owned", "--set", "max_machines=5")
    assert updated.returncode == 0
    assert updated.stdout.strip() == "updated owned: max_machines 3 -> 5"
    bad = thaw(up, "apps", "create", "broken", "--image", "x",
               "--set", "concurrency.hard_limit=1")
    assert bad.returncode == 2 and "concurrency.hard_limit" in bad.stderr
    assert call("GET", f"{up.api}/v1/apps/broken", token=up.token)[0] == 404
    listed = thaw(up, "apps", "list")
    assert listed.returncode == 0 and "owned" in listed.stdout
    deleted = thaw(up, "apps", "delete", "owned")
    assert deleted.returncode == 0
    assert call("GET", f"{up.api}/v1/apps/owned", token=up.token)[0] == 404


def as_owner(up: ThawUp, where: Path, *args: str,
             **more_env: str) -> subprocess.CompletedProcess[str]:
    """`thaw ARGS` run in `where` with no flag and no THAW_ variable (but `more_env`):
    only the contexts `thaw up` wrote say which platform."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env |= {"THAW_CONFIG": str(up.cli_config), "COLUMNS": "100", **more_env}
    return subprocess.run([sys.executable, "-m", "thaw", *args], cwd=where, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_launch_in_a_directory_with_a_dockerfile_and_deploy_build_it_and_open_gives_its_url(
    up: ThawUp, tmp_path: Path
) -> None:
    """As `fly launch` and `fly deploy` with a Dockerfile: launch writes [build] instead of
    asking for an image, deploy builds it into the platform's layout (the context `thaw
    up` wrote says where) and deploys it; `thaw apps open` and `thaw status APP` say the
    URL the app answers on."""
    wait_until(lambda: (up.cli_config / "contexts.json").exists(), 10)
    app = tmp_path / "built"
    app.mkdir()
    (app / "app.py").write_text((HELLO / "app.py").read_text())
    (app / "Dockerfile").write_text(
        "FROM builtin:python3\nWORKDIR /app\nCOPY app.py .\nENV PYTHONUNBUFFERED=1\n"
        "EXPOSE 8080\nCMD [\"python3\", \"app.py\"]\n")
    launched = as_owner(up, app, "launch", "--yes", "--cpus", "0.25", "--memory-mb", "64",
                        THAW_CONTEXT="local")  # picks the platform; not written to the file
    assert launched.returncode == 0, launched.stderr
    assert "found Dockerfile: thaw deploy builds it" in launched.stdout
    toml = (app / "thaw.toml").read_text()
    assert 'app = "built"' in toml and '[build]\n' in toml and "\nimage =" not in toml
    assert "\ncontext =" not in toml

    deployed = as_owner(up, app, "deploy")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    built = re.search(r"built Dockerfile -> (oci:\S+:built:deploy-[0-9a-f]{12})",
                      deployed.stdout)
    assert built is not None, deployed.stdout
    assert "created app built: release 1" in deployed.stdout
    _, config = call("GET", f"{up.api}/v1/apps/built", token=up.token)
    assert config["image"] == built.group(1) and config["image_digest"].startswith("sha256:")
    again = as_owner(up, app, "deploy")  # the same files: the same image, nothing to do
    assert again.returncode == 0 and "up to date: release 1" in again.stdout, again.stdout

    opened = as_owner(up, app, "apps", "open")  # thaw.toml names the app
    assert opened.returncode == 0, opened.stderr
    url = opened.stdout.split()[0]
    assert url == f"http://built.localhost:{up.edge_port}/"
    host = url.split("//")[1].split(":")[0]  # *.localhost: this host, for curl and browsers
    connection = http.client.HTTPConnection("127.0.0.1", up.edge_port, timeout=60)
    connection.request("GET", "/", headers={"Host": host})
    assert connection.getresponse().status == 200  # woken: the image deploy built runs
    connection.close()
    shown = as_owner(up, app, "status", "built")
    assert shown.returncode == 0 and f"url {url}" in shown.stdout, shown.stdout
    assert json.loads(as_owner(up, app, "status", "built", "--json").stdout)["url"] == url


def test_thaw_status_from_another_directory_finds_the_platform_by_its_context(
    up: ThawUp, tmp_path: Path
) -> None:
    """`thaw up` on its own ports writes the context `local`; `thaw status` with no flag,
    no THAW_ variable and not in the platform's directory finds it. A second context is
    picked with --context and made current with `thaw context use`."""
    wait_until(lambda: (up.cli_config / "contexts.json").exists(), 10)
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env |= {"THAW_CONFIG": str(up.cli_config), "COLUMNS": "100"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def bare(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "thaw", *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    status = bare("status")
    assert status.returncode == 0 and "WORKERS" in status.stdout, status.stderr
    closed = free_port()
    assert bare("context", "add", "other", "--api", f"127.0.0.1:{closed}").returncode == 0
    listed = bare("context", "list")
    assert "* " in listed.stdout and "local" in listed.stdout and "other" in listed.stdout
    other = bare("status", "--context", "other")
    assert other.returncode == 1 and f"127.0.0.1:{closed}" in other.stderr
    assert bare("context", "use", "other").returncode == 0
    assert bare("status").returncode == 1  # the current one is other now
    assert bare("status", "--context", "local").returncode == 0
    unknown = bare("status", "--context", "nope")
    assert unknown.returncode == 2 and "no context 'nope'" in unknown.stderr
    assert bare("context", "use", "local").returncode == 0


def test_an_unknown_app_is_a_clear_error_not_a_traceback(up: ThawUp) -> None:
    shown = thaw(up, "apps", "show", "nope")
    assert shown.returncode == 1 and "HTTP 404" in shown.stderr and "Traceback" not in shown.stderr


def test_launch_writes_a_thaw_toml_that_deploy_accepts_and_a_second_deploy_changes_nothing(
    up: ThawUp, tmp_path: Path
) -> None:
    build_image(HELLO, "hello:v3", layout=tmp_path / "layout")
    launched = thaw(up, "launch", "--name", "launched", "--image",
                    f"oci:{tmp_path / 'layout'}:v3", "--soft-limit", "4", "--hard-limit", "6",
                    "--cpus", "0.25", "--memory-mb", "64", "-c", str(tmp_path / "thaw.toml"))
    assert launched.returncode == 0, launched.stderr
    text = (tmp_path / "thaw.toml").read_text()
    assert 'app = "launched"' in text and "# max_machines = 3" in text  # defaults commented
    again = thaw(up, "launch", "--name", "x", "--image", "r/x:1", "-c", str(tmp_path / "thaw.toml"))
    assert again.returncode != 0 and "exists" in again.stderr  # never overwritten silently
    deployed = thaw(up, "deploy", "-c", str(tmp_path / "thaw.toml"))
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout.startswith("created app launched: release 1")
    _, app = call("GET", f"{up.api}/v1/apps/launched", token=up.token)
    assert app["concurrency"] == {"type": "requests", "soft_limit": 4, "hard_limit": 6}
    same = thaw(up, "deploy", "-c", str(tmp_path / "thaw.toml"))
    assert same.returncode == 0 and "up to date: release 1" in same.stdout
    _, after = call("GET", f"{up.api}/v1/apps/launched", token=up.token)
    assert after["version"] == app["version"]  # a no-op deploy stores nothing

    # thaw.toml is the declared shape: a machine field changed is one release, one version
    (tmp_path / "thaw.toml").write_text(text.replace("# kill_timeout_s = 5.0",
                                                     "kill_timeout_s = 6.0"))
    changed = thaw(up, "deploy", "-c", str(tmp_path / "thaw.toml"))
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.startswith("release 2 of launched")
    assert "complete" in changed.stdout  # the rollout followed to its end
    _, last = call("GET", f"{up.api}/v1/apps/launched", token=up.token)
    assert (last["version"], last["release"]) == (app["version"] + 1, 2)


def test_a_mistyped_thaw_toml_field_gets_a_suggestion_from_the_cli_and_the_api(
    up: ThawUp, tmp_path: Path
) -> None:
    toml = tmp_path / "thaw.toml"
    toml.write_text('app = "typo"\nimage = "r/x:1"\nmax_machnes = 2\n[guest]\ncpu = 1\n')
    run = thaw(up, "deploy", "-c", str(toml))
    assert run.returncode == 2 and "did you mean `max_machines`?" in run.stderr
    status, body = call("POST", f"{up.api}/v1/apps", {"name": "typo", "image": "r/x:1",
                                                       "guest": {"cpu": 1}}, token=up.token)
    assert status == 422 and body["field"] == "guest.cpu"
    assert "did you mean `cpus`?" in body["message"]


def test_scale_machines_logs_and_placements(up: ThawUp, tmp_path: Path) -> None:
    build_image(HELLO, "hello:v4", layout=tmp_path / "layout")
    created = thaw(up, "apps", "create", "scaled", "--image", f"oci:{tmp_path / 'layout'}:v4",
                   "--set", "guest.cpus=0.25", "--set", "guest.memory_mb=64")
    assert created.returncode == 0, created.stderr
    scaled = thaw(up, "scale", "min", "2", "-a", "scaled")
    assert scaled.returncode == 0 and scaled.stdout.startswith("scaled: min 2, max 3")
    _, app = call("GET", f"{up.api}/v1/apps/scaled", token=up.token)
    assert app["min_machines_running"] == 2

    made = thaw(up, "machines", "create", "scaled", "--wait", "--json")
    assert made.returncode == 0, made.stderr
    machine = json.loads(made.stdout)
    assert machine["state"] == "started"
    stopped = thaw(up, "machines", "stop", "scaled", machine["id"], "--wait")
    assert stopped.stdout.strip() == f"machine {machine['id']} of scaled: stopped"

    logs = thaw(up, "logs", "scaled")  # the example app prints "hello ID listening on …"
    assert logs.returncode == 0, logs.stderr
    # each line: the machine, the time the agent took it in (RFC 3339, UTC), the line
    stamped = re.compile(rf"^{machine['id']}  \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}Z "
                         rf"hello {machine['id']} listening on", re.M)
    assert stamped.search(logs.stdout), logs.stdout

    placements = thaw(up, "placements", "scaled", "-n", "1")
    assert placements.returncode == 0 and "placed" in placements.stdout
    assert "WORKER" in placements.stdout and "LAYERS" in placements.stdout

    destroyed = thaw(up, "machines", "destroy", "scaled", machine["id"], "--wait")
    assert destroyed.stdout.strip() == f"machine {machine['id']} of scaled: destroyed", \
        destroyed.stderr
    count = thaw(up, "scale", "count", "0", "-a", "scaled", "--json")
    assert json.loads(count.stdout)["min_machines_running"] == 0


def test_logs_follow_prints_what_a_machine_writes_after_it_started(
    up: ThawUp, tmp_path: Path
) -> None:
    build_image(HELLO, "hello:v5", layout=tmp_path / "layout")
    assert thaw(up, "apps", "create", "followed", "--image", f"oci:{tmp_path / 'layout'}:v5",
                "--set", "guest.cpus=0.25", "--set", "guest.memory_mb=64").returncode == 0
    env = {**os.environ, "THAW_TOKEN": up.token}
    follower = subprocess.Popen([sys.executable, "-m", "thaw", "logs", "followed", "-f",
                                 "--interval", "0.2", "--api", up.api],
                                stdout=subprocess.PIPE, text=True, env=env)
    try:
        made = thaw(up, "machines", "create", "followed", "--wait", "--json")
        mid = json.loads(made.stdout)["id"]
        assert follower.stdout is not None
        line = follower.stdout.readline()  # the machine's first line, read as it came
        assert re.match(rf"{mid}  \S+Z hello {mid} listening on", line), line
    finally:
        follower.terminate()
        follower.wait(timeout=10)


def test_json_output_of_every_read_command_parses(up: ThawUp) -> None:
    for args in (("status",), ("status", "hello"), ("apps", "list"), ("apps", "show", "hello"),
                 ("machines", "list", "hello"), ("releases", "hello"), ("events", "hello"),
                 ("placements", "hello"), ("logs", "hello"), ("tokens", "list")):
        run = thaw(up, *args, "--json")
        assert run.returncode == 0, (args, run.stderr)
        json.loads(run.stdout)
