"""Changes of one app do not interleave, and a new app of a deleted app's name inherits
nothing of it — the races a tester found with a slow registry, replayed here."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from imagecache.core.egress import EgressPolicy
from placement.runner import PlacementRuntime
from tests.support import docker_registry as registry_support
from tests.support.docker_registry import DockerRegistry
from tests.support.placement_helpers import HELLO, Platform, eventually
from tests.support.registry_proxy import RegistryProxy
from thaw.imagebuild import build_image

pytestmark = pytest.mark.integration
docker_registry = registry_support.docker_registry  # the session fixture, by name
SMALL = {"cpus": 0.25, "memory_mb": 64}


@pytest.fixture(scope="module")
def pushed(docker_registry: DockerRegistry) -> str:
    build_image(HELLO, "hello:v2", push=docker_registry.url)
    return build_image(HELLO, "hello:v1", push=docker_registry.url)


def live_machines(p: Platform, app: str) -> list[str]:
    return [m.id for r in p.agents if r.agent is not None
            for m in r.agent.state.machines.values()
            if m.spec.app == app and m.state.value not in ("destroying", "destroyed")]


async def test_a_delete_during_a_slow_deploy_waits_for_it_and_leaves_no_machine_behind(
    tmp_path: Path, docker_registry: DockerRegistry, pushed: str
) -> None:
    async with RegistryProxy(docker_registry.url) as slow:
        egress = EgressPolicy.build([slow.host], listed_only=True)
        async with Platform(tmp_path, egress=egress) as p:
            await p.create_app(name="orph", image=f"{slow.host}/hello:v1", guest=SMALL,
                               min_machines_running=1)
            slow.manifest_delay_s = 1.5
            deploy = asyncio.create_task(p.call("POST", "/v1/apps/orph/deploy"))
            await asyncio.sleep(0.3)
            status, deleted = await p.call("DELETE", "/v1/apps/orph")
            assert status == 200
            status, deployed = await deploy
            assert status == 200, deployed
            # the delete ran after the deploy's change: what the reconciler made for it
            # was destroyed by the delete, or by the reconciler itself on seeing the app
            # gone (then the deploy reports none)
            made = [m["id"] for m in deployed["machines"]]
            assert set(made) <= set(deleted["machines"])
            await eventually(lambda: _none_live(p, "orph"))
            slow.manifest_delay_s = 0
            again = await p.create_app(name="orph", image=f"{slow.host}/hello:v2", guest=SMALL)
            assert again["uid"] != deployed["app"]["uid"]
            status, machines = await p.call("GET", "/v1/apps/orph/machines")
            assert status == 200 and [m for m in machines
                                      if m["state"] not in ("destroying", "destroyed")] == []


async def _none_live(p: Platform, app: str) -> bool:
    return live_machines(p, app) == []


async def test_a_new_app_of_a_name_destroys_what_an_earlier_one_left_before_it_exists(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path) as p:
        await p.create_app(name="reborn", image=hello_layout, guest=SMALL)
        status, woke = await p.call("POST", "/internal/apps/reborn/wake",
                                    {"count": 1, "deadline_ms": 20_000})
        assert status == 200, woke
        [left] = live_machines(p, "reborn")
        # the app goes while its machine stays (as when its agent was away at the delete)
        assert p.placement.placement is not None
        await p.placement.placement.store.delete("reborn")
        await p.registry.delete_app("reborn")
        created = await p.create_app(name="reborn", image=hello_layout, guest=SMALL)
        assert created["version"] == 1
        assert left not in live_machines(p, "reborn")  # destroyed before the 201
        status, machines = await p.call("GET", "/v1/apps/reborn/machines")
        assert [m for m in machines if m["state"] not in ("destroying", "destroyed")] == []


async def test_a_patch_during_a_slow_image_change_is_applied_after_it_not_lost(
    tmp_path: Path, docker_registry: DockerRegistry, pushed: str
) -> None:
    async with RegistryProxy(docker_registry.url) as slow:
        egress = EgressPolicy.build([slow.host], listed_only=True)
        async with Platform(tmp_path, agents=0, egress=egress) as p:
            await p.create_app(name="app", image=f"{slow.host}/hello:v1", max_machines=10)
            slow.manifest_delay_s = 1.0
            image = asyncio.create_task(
                p.call("PATCH", "/v1/apps/app", {"image": f"{slow.host}/hello:v2"}))
            await asyncio.sleep(0.2)
            status, small = await p.call("PATCH", "/v1/apps/app",
                                         {"max_machines": 1, "auto_start": False})
            assert status == 200 and small["image"].endswith("hello:v2")  # came after
            assert (await image)[0] == 200
            status, final = await p.call("GET", "/v1/apps/app")
            assert (final["image"], final["max_machines"], final["auto_start"],
                    final["version"]) == (f"{slow.host}/hello:v2", 1, False, 3)


async def test_changes_of_one_app_queue_up_to_a_bound_then_answer_429(
    tmp_path: Path, docker_registry: DockerRegistry, pushed: str
) -> None:
    async with RegistryProxy(docker_registry.url) as slow:
        egress = EgressPolicy.build([slow.host], listed_only=True)
        async with Platform(tmp_path, agents=0, egress=egress) as p:
            await p.create_app(name="app", image=f"{slow.host}/hello:v1")
            await p.create_app(name="other", image=f"{slow.host}/hello:v1")
            slow.manifest_delay_s = 0.3
            # every one a change of image (v2, v1, v2, ...): each resolves, slowly
            patches = [asyncio.create_task(p.call(
                "PATCH", "/v1/apps/app", {"image": f"{slow.host}/hello:v{2 - i % 2}"}))
                for i in range(12)]
            await asyncio.sleep(0.1)
            status, _ = await p.call("PATCH", "/v1/apps/other", {"max_machines": 2})
            assert status == 200  # another app's change is not behind them
            answers = [status for status, _ in await asyncio.gather(*patches)]
            # one in progress and MAX_QUEUED (8) waiting; the other three are refused
            assert (answers.count(200), answers.count(429)) == (9, 3), answers


async def test_waits_on_one_apps_machines_are_bounded_per_app(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path) as p:
        await p.create_app(name="app", image=hello_layout, guest=SMALL)
        status, spare = await p.call("POST", "/v1/apps/app/machines", {"start": False})
        assert status == 201, spare
        wait = f"/v1/apps/app/machines/{spare['id']}/wait?state=destroyed&timeout_s=2"
        waits = [asyncio.create_task(p.call("GET", wait)) for _ in range(20)]
        answers = [status for status, _ in await asyncio.gather(*waits)]
        assert answers.count(429) == 4 and answers.count(408) == 16, answers


async def test_waits_that_fill_their_connections_leave_wakes_theirs(
    tmp_path: Path, hello_layout: str
) -> None:
    """4 connections a pool: 4 long waits fill the waits' pool; a wake (whose start call
    waits for the machine too) still gets a connection of its own before its deadline."""
    async with Platform(tmp_path, agents=1, agent_connections=4) as p:
        await p.create_app(name="app", image=hello_layout, guest=SMALL)
        status, spare = await p.call("POST", "/v1/apps/app/machines", {"start": False})
        assert status == 201, spare
        wait = f"/v1/apps/app/machines/{spare['id']}/wait?state=destroyed&timeout_s=4"
        waits = [asyncio.create_task(p.call("GET", wait)) for _ in range(4)]
        await asyncio.sleep(0.3)  # all four hold their connections now
        await p.create_app(name="busy", image=hello_layout, guest=SMALL)
        status, woke = await p.call("POST", "/internal/apps/busy/wake",
                                    {"count": 1, "deadline_ms": 2_500})
        assert status == 200, woke
        assert [status for status, _ in await asyncio.gather(*waits)] == [408] * 4


async def test_a_body_that_is_not_utf_8_is_422_everywhere_not_500(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path) as p:
        await p.create_app(name="app", image=hello_layout)
        bad = b'{"name": "\xff"}'
        for method, path in [("POST", "/v1/apps"), ("PATCH", "/v1/apps/app"),
                             ("POST", "/v1/tokens"), ("POST", "/v1/apps/app/deploy"),
                             ("POST", "/v1/apps/app/machines"),
                             ("POST", "/internal/apps/app/wake")]:
            status, body = await p.call_raw(method, path, bad)
            assert status == 422, (path, body)
        worker = p.agents[0].url
        status, body = await p.call_raw("POST", worker + "/v1/offers", bad)
        assert status == 422, body


async def test_a_machine_of_another_incarnation_of_the_name_is_not_the_apps_in_any_way(
    tmp_path: Path, hello_layout: str
) -> None:
    """As if an agent that was away at a delete came back with the old app's machine."""
    async with Platform(tmp_path) as p:
        app = await p.create_app(name="x", image=hello_layout, guest=SMALL)
        status, left = await p.call("POST", p.agents[0].url + "/v1/offers", {
            "key": "leftover", "app": "x", "app_uid": "fedcba9876543210",
            "image": hello_layout, "guest": SMALL, "start": True})
        assert status == 201, left
        await eventually(lambda: _started(p, left["id"]))
        status, machines = await p.call("GET", "/v1/apps/x/machines")
        assert status == 200 and machines == []
        for path in ("", "/stop", "/wait?state=stopped&timeout_s=1"):
            method = "POST" if path == "/stop" else "GET"
            status, _ = await p.call(method, f"/v1/apps/x/machines/{left['id']}{path}")
            assert status == 404, path
        status, woke = await p.call("POST", "/internal/apps/x/wake",
                                    {"count": 1, "deadline_ms": 20_000})
        assert status == 200 and woke["machines"][0]["id"] != left["id"], woke
        status, mine = await p.call("GET", "/v1/apps/x/machines")
        assert [m["app_uid"] for m in mine] == [app["uid"]]
        status, deleted = await p.call("DELETE", "/v1/apps/x")  # the name's machines, all
        assert status == 200 and left["id"] in deleted["machines"]


async def _started(p: Platform, machine_id: str) -> bool:
    return any(m.state.value == "started" for r in p.agents if r.agent is not None
               for mid, m in r.agent.state.machines.items() if mid == machine_id)


async def test_a_wake_after_a_restart_needs_no_registry_when_the_worker_holds_the_image(
    tmp_path: Path, docker_registry: DockerRegistry, pushed: str
) -> None:
    """Images are resolved at create and deploy, never on a request: placement keeps the
    layer lists it pinned, so a wake does not ask the registry, even after a restart."""
    registry = RegistryProxy(docker_registry.url)
    await registry.__aenter__()
    egress = EgressPolicy.build([registry.host], listed_only=True)
    async with Platform(tmp_path, agents=1, egress=egress) as p:
        try:
            await p.create_app(name="app", image=f"{registry.host}/hello:v1", guest=SMALL,
                               max_machines=2, health={"path": "/healthz", "timeout_s": 15})
            status, woke = await p.call("POST", "/internal/apps/app/wake",
                                        {"count": 1, "deadline_ms": 20_000})
            assert status == 200, woke  # the worker pulled the image through the registry
            first = woke["machines"][0]["id"]
        finally:
            await registry.__aexit__()  # the registry is gone from here on
        await p.placement.stop()
        p.placement = PlacementRuntime(p.placement.config, p.registry)
        p.url = await p.placement.start()
        status, woke = await p.call("POST", "/internal/apps/app/wake",
                                    {"count": 2, "deadline_ms": 20_000})
        assert status == 200, woke
        [second] = woke["machines"]  # placed, pulled from the worker's cache, started
        assert second["id"] != first
