"""The load-test scenarios and how the driver readies a deployment for each, through
placement's public API and the edge only (so it works against any deployment).

What a run changes it undoes: fields it set on the app are put back, apps it created
are deleted. Two things stay: the machines a cold scenario stopped (they wake on the next
request), and the release a `deploy` run made.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from thaw.client import ApiClient, ApiError

RUNNING = ("started", "starting")
MACHINE_FIELDS = ("image", "regions", "guest", "port", "env", "health", "kill_signal",
                  "kill_timeout_s")  # what a wake-herd app copies from the target app


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    burst: bool = False  # sized by --requests (all at once), else by --duration
    cold: bool = False  # the app must have no running machine when the load starts
    warm: bool = False  # the app is woken before the load starts
    action: str = ""  # "deploy" or "kill", done by the driver mid-run
    sets: dict[str, Any] = field(default_factory=dict)  # set on the app for the run
    settle_s: float = 2.0  # machines are sampled this long after the load at most
    settle_until_stopped: bool = False  # … ending early once none is started

    @property
    def k6_script(self) -> str:
        return f"{self.name}.js"


SCENARIOS = {s.name: s for s in (
    Scenario("cold-burst", "N requests at once to an app with no running machine",
             burst=True, cold=True),
    Scenario("steady", "steady warm load: --rate requests/s for --duration", warm=True),
    Scenario("ramp", "concurrent clients ramp up to --peak-concurrency and back down to 0; "
             "machines follow the load up and stop once idle after it",
             sets={"concurrency": {"type": "requests", "soft_limit": 2, "hard_limit": 3},
                   "max_machines": 5, "idle_timeout_s": 5},
             settle_s=60.0, settle_until_stopped=True),
    Scenario("wake-herd", "many cold apps at once: --apps apps made from the target app's "
             "image, --requests requests spread over them",
             burst=True, cold=True, sets={"guest": {"cpus": 0.25, "memory_mb": 64},
                                          "idle_timeout_s": 10}),
    Scenario("deploy", "a new release rolls out under steady load (the driver patches the "
             "app's env, or deploys --deploy-image, at --action-at)",
             warm=True, action="deploy", settle_s=5.0),
    Scenario("host-loss", "a worker is killed (agent and machines, kill -9) under steady "
             "load at --action-at; needs agents as separate processes",
             warm=True, action="kill", sets={"spares": 1}, settle_s=5.0),
)}


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` laid over it, nested dicts merged (like a JSON merge patch)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def revert_patch(config: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that puts back what `patch` changes in `config` (whole top-level
    fields: a nested field's siblings are restored as they were)."""
    return {key: config.get(key) for key in patch}


class Deployment:
    """The platform under test: placement's API (`api`) and the edge (`base_url`)."""

    def __init__(self, api: ApiClient, base_url: str, domain: str = "localhost",
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api
        self.base_url = base_url.rstrip("/")
        self.domain = domain
        self.sleep = sleep

    def app(self, name: str) -> dict[str, Any]:
        return dict(self.api.get(f"/v1/apps/{name}"))

    def machines(self, app: str) -> list[dict[str, Any]]:
        return [m for m in self.api.get(f"/v1/apps/{app}/machines")
                if m.get("state") != "destroyed"]

    def patch(self, app: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Set `fields` on `app`; returns the patch that puts them back."""
        undo = revert_patch(self.app(app), fields)
        if fields:
            self.api.patch(f"/v1/apps/{app}", fields)
        return undo

    def put_to_sleep(self, app: str, timeout_s: float = 60.0) -> int:
        """Stop every started or starting machine of `app` and wait until none runs;
        returns how many were stopped. An app that keeps machines running is refused."""
        config = self.app(app)
        if config.get("min_machines_running", 0) > 0:
            raise ValueError(f"{app} keeps {config['min_machines_running']} machine(s) "
                             "running (min_machines_running): it cannot be cold")
        running = [m for m in self.machines(app) if m["state"] in RUNNING]
        for machine in running:
            try:
                self.api.post(f"/v1/apps/{app}/machines/{machine['id']}/stop")
            except ApiError as exc:
                if exc.status not in (404, 409):  # gone, or already stopping: waited below
                    raise
        self.wait(lambda: not any(m["state"] in RUNNING or m["state"] == "stopping"
                                  for m in self.machines(app)),
                  timeout_s, f"{app}'s machines did not stop")
        if running:
            self.sleep(1.0)  # the edge hears of the stops through the registry
        return len(running)

    def wake(self, host: str, path: str = "/", timeout_s: float = 60.0) -> None:
        """GET through the edge until one answers 2xx: the app has a started machine."""
        self.wait(lambda: 200 <= edge_get(self.base_url, host, path) <= 299, timeout_s,
                  f"{host} did not answer 2xx through {self.base_url}")

    def create_herd(self, source: str, count: int, fields: dict[str, Any]) -> list[str]:
        """`count` apps made from `source`'s machine fields with `fields` over them, named
        loadtest-herd-NN (any left by an earlier run are deleted first)."""
        config = self.app(source)
        base = {key: config[key] for key in MACHINE_FIELDS if key in config}
        names = [f"loadtest-herd-{i:02d}" for i in range(count)]
        for name in names:
            self.delete(name)
            self.api.post("/v1/apps", merged({**base, "name": name}, fields))
        self.sleep(1.0)  # the edge hears of the new apps through the registry
        return names

    def delete(self, app: str) -> None:
        try:
            self.api.delete(f"/v1/apps/{app}")
        except ApiError as exc:
            if exc.status != 404:
                raise

    def deploy(self, app: str, image: str = "") -> str:
        """A new release of `app` under load: `image` deployed, else the same image with a
        changed env (`LOADTEST_RELEASE`), which is a release too. Returns a label."""
        if image:
            answer = self.api.post(f"/v1/apps/{app}/deploy", {"image": image})
            release = (answer or {}).get("release") or {}
            return f"deploy v{release.get('version', '?')}"
        marker = {"env": {"LOADTEST_RELEASE": f"{time.time():.0f}"}}
        config = self.api.patch(f"/v1/apps/{app}", marker) or {}
        return f"deploy v{config.get('release', '?')}"

    def wait(self, ready: Callable[[], bool], timeout_s: float, failure: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{failure} within {timeout_s:g} s")
            self.sleep(0.2)


def edge_get(base_url: str, host: str, path: str = "/", timeout_s: float = 30.0) -> int:
    """One GET through the edge with `host` as Host; the status, 0 without an answer."""
    parts = urlsplit(base_url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()
