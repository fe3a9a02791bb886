"""Failed machines don't block an app's shape, with real agents and machine processes: a
worker that cannot pull says so and is passed over (the app reaches its minimum on the
other), and a failed machine is destroyed, its last words kept, and replaced although
it filled `max_machines`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.records import Fenced
from agent.errors import DiskFull
from tests.support.disks import fill, tmpfs
from tests.support.placement_helpers import HELLO, Platform, eventually, script_image
from thaw.imagebuild import build_image

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("images")
    build_image(HELLO, "hello:v1", layout=root / "hello")
    mute = script_image(root, "mute", "print('listening soon', flush=True); import time; "
                                      "time.sleep(120)")
    return {"hello": f"oci:{root / 'hello'}:v1", "mute": mute}


@pytest.fixture
def small_first_agent(tmp_path: Path) -> Iterator[Path]:
    """The first agent's state dir (worker w0) on a 64 MiB tmpfs: its free disk is below
    the image cache's 512 MiB reserve, so it cannot pull; everything else it can do."""
    yield from tmpfs(tmp_path / "agent0", "64m")


@pytest.fixture
def first_agent_with_room_for_a_pull(tmp_path: Path) -> Iterator[Path]:
    """The first agent's state dir on a tmpfs with room above the cache's reserve for
    hello (~16 MiB of blobs, ~50 MiB unpacked), to be filled."""
    yield from tmpfs(tmp_path / "agent0", "640m")


def app(image: str, **fields: object) -> dict[str, object]:
    config: dict[str, object] = {
        "name": "hello", "image": image, "guest": {"cpus": 0.25, "memory_mb": 64},
        "health": {"path": "/healthz", "timeout_s": 3},
    }
    config.update(fields)
    return config


async def machines(p: Platform) -> list[dict[str, Any]]:
    _, found = await p.call("GET", "/v1/apps/hello/machines")
    return list(found)


async def test_a_worker_that_cannot_pull_says_so_and_the_app_reaches_its_minimum_elsewhere(
    tmp_path: Path, images: dict[str, str], small_first_agent: Path
) -> None:
    async with Platform(tmp_path, agents=2) as p:
        async def said_so() -> bool:
            _, workers = await p.call("GET", "/v1/workers")
            blocked = {w["id"]: w["pull_blocked"] for w in workers}
            return "below the image cache's reserve" in blocked["w0"] and not blocked["w1"]

        await eventually(said_so, timeout_s=10)
        # the spread rule would send the second machine to w0: it is filtered instead
        await p.create_app(**app(images["hello"], min_machines_running=2, max_machines=3))

        async def at_minimum() -> bool:
            return sum(m["state"] == "started" for m in await machines(p)) == 2

        await eventually(at_minimum, timeout_s=60)
        found = await machines(p)
        assert {m["worker"] for m in found} == {"w1"}, found
        assert not any(m["state"] == "failed" for m in found), found
        _, placements = await p.call("GET", "/v1/apps/hello/placements")
        filtered = [f for d in placements for f in d.get("filtered", [])]
        assert any(f["worker"] == "w0" and f["reason"].startswith("cannot pull: free disk")
                   for f in filtered), placements


async def test_a_failed_machine_is_destroyed_with_its_last_output_and_replaced_within_max(
    tmp_path: Path, images: dict[str, str]
) -> None:
    """A machine that never answers its health check fails; with `max_machines = 1` it
    used to hold the app's only place for ever. It is destroyed (its last output among
    the app's events) and a new one made; they keep failing, so new ones are held back
    (1 s, doubling)."""
    async with Platform(tmp_path, agents=1) as p:
        await p.create_app(**app(images["mute"], min_machines_running=1, max_machines=1))

        async def replaced() -> bool:
            _, events = await p.call("GET", "/v1/apps/hello/events")
            destroyed = {e["machine"] for e in events if e["action"] == "destroy"
                         and "failed" in e["reason"] and "listening soon" in e["reason"]}
            made = {e["machine"] for e in events if e["action"] == "create"}
            return bool(destroyed) and bool(made - destroyed)

        await eventually(replaced, timeout_s=60)


async def test_a_machine_starting_when_the_disk_filled_is_replaced_once_room_returns(
    tmp_path: Path, images: dict[str, str], first_agent_with_room_for_a_pull: Path
) -> None:
    """The disk fills while the machine starts (after its process is launched, before
    that is written): the agent kills the process and, once room returns, writes the
    machine failed; the reconciler destroys it (why, in the app's events) and the app
    gets its machine back although `max_machines = 1`."""
    async with Platform(tmp_path, agents=1) as p:
        agent = p.agents[0].agent
        assert agent is not None
        driver = agent.driver
        launch = driver.launch
        filled: list[Path] = []

        async def launch_then_fill(spec: Any) -> Any:
            running = await launch(spec)
            if not filled:
                filled.append(fill(first_agent_with_room_for_a_pull))
                token = 0
                while True:  # the log's last page too
                    token += 1
                    try:
                        agent.journal.write(Fenced("slack", token, time.time()))
                    except DiskFull:
                        break
            return running

        driver.launch = launch_then_fill  # type: ignore[method-assign]
        await p.create_app(**app(images["hello"], min_machines_running=1, max_machines=1))

        async def disk_filled() -> bool:
            return bool(filled) and agent.disk_short()

        await eventually(disk_filled, timeout_s=30)
        first = next(iter(agent.state.machines))
        await asyncio.sleep(1.0)  # its start could not be written: it waits for room
        filled[0].unlink()

        async def replaced() -> bool:
            found = await machines(p)
            return any(m["state"] == "started" and m["id"] != first for m in found)

        await eventually(replaced, timeout_s=60)
        _, events = await p.call("GET", "/v1/apps/hello/events")
        assert any(e["action"] == "destroy" and e["machine"] == first
                   and "could not be recorded" in e["reason"] for e in events), events
