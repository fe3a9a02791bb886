"""Placement with real in-process agents on loopback, and a small JSON client for them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import yarl

from agent.api import Guest, MachineView
from agent.config import AgentConfig
from agent.core.machine import MachineState
from agent.runner import AgentRuntime
from ground.auth.sealing import SecretKeys
from ground.auth.tickets import RouteKeys
from ground.registry import Registry
from ground.registry.memory import MemoryRegistry
from imagecache.adapters.egress import Lookup
from imagecache.core.egress import EgressPolicy
from placement.config import PlacementConfig
from placement.runner import PlacementRuntime
from tests.support.credentials import (
    ADMIN_TOKEN,
    RING,
    ROUTE_KEYS,
    SECRETS_RING,
    bearer,
    signed_headers,
)
from tests.support.machines import TEST_DRIVER

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


@pytest.fixture(scope="module")
def hello_layout(tmp_path_factory: pytest.TempPathFactory) -> str:
    """examples/hello as an OCI layout (a reference placement resolves at create)."""
    from thaw.imagebuild import build_image

    layout = tmp_path_factory.mktemp("hello-layout")
    build_image(HELLO, "hello:v1", layout=layout)
    return f"oci:{layout}:v1"


def script_image(root: Path, name: str, code: str) -> str:
    """An image of builtin:python3 whose entrypoint is `python3 -c code`, built as the
    OCI layout `root/name`: its reference (tag v1)."""
    from thaw.imagebuild import build_image

    source = root / f"{name}-src"
    source.mkdir()
    (source / "thaw-image.toml").write_text(
        f'from = "builtin:python3"\nentrypoint = ["python3", "-c", {json.dumps(code)}]\n')
    build_image(source, f"{name}:v1", layout=root / name)
    return f"oci:{root / name}:v1"


class Platform:
    """A MemoryRegistry, `agents` AgentRuntimes and one PlacementRuntime, all in this loop.

    Images may come from oci: layouts anywhere under this test run's temp root (and
    `egress` says what else); API calls carry the test admin token unless told otherwise,
    and internal ones are signed with the test cluster key."""

    def __init__(self, root: Path, agents: int = 2, cpus: float = 2, memory_mb: int = 1024,
                 registry: Registry | None = None, offer_timeout_s: float = 5.0,
                 egress: EgressPolicy | None = None, domain: str = "localhost",
                 lookup: Lookup | None = None, agent_connections: int = 256,
                 secret_keys: SecretKeys | None = SECRETS_RING,
                 route_keys: RouteKeys | None = ROUTE_KEYS) -> None:
        self.root = root
        self.registry = registry or MemoryRegistry()
        egress = egress or EgressPolicy.build(layout_dirs=[str(root.parent.resolve())])
        self.agents = [
            AgentRuntime(
                AgentConfig(state_dir=root / f"agent{i}", cluster_keys=RING, egress=egress,
                            cpus=cpus, memory_mb=memory_mb, worker_id=f"w{i}",
                            heartbeat_interval_s=0.2, stop_machines_on_exit=True,
                            driver=TEST_DRIVER),
                self.registry,
            )
            for i in range(agents)
        ]
        self.placement = PlacementRuntime(
            PlacementConfig(state_dir=root / "placement", cluster_keys=RING,
                            admin_token=ADMIN_TOKEN, egress=egress, domain=domain, port=0,
                            heartbeat_interval_s=1.0, offer_timeout_s=offer_timeout_s,
                            agent_connections=agent_connections, secret_keys=secret_keys,
                            route_keys=route_keys),
            self.registry, lookup=lookup,
        )
        self.url = ""
        self.http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Platform:
        self.http = aiohttp.ClientSession()
        for agent in self.agents:
            await agent.start()
        self.url = await self.placement.start()
        await eventually(self._workers_published)
        return self

    async def _workers_published(self) -> bool:
        return len(await self.registry.workers()) == len(self.agents)

    async def __aexit__(self, *exc: object) -> None:
        await self.placement.stop()
        for runtime in self.agents:
            await destroy_all(runtime)
        for runtime in self.agents:
            await runtime.stop()
        if self.http is not None:
            await self.http.close()

    async def call(self, method: str, path: str, body: Any = None, timeout_s: float = 30,
                   token: str = ADMIN_TOKEN, signed: bool = True) -> tuple[int, Any]:
        """One call: `token` as bearer ("" for none), signed unless told not to."""
        data = json.dumps(body).encode() if body is not None else b""
        return await self.call_raw(method, path, data, timeout_s, token, signed)

    async def call_raw(self, method: str, path: str, data: bytes, timeout_s: float = 30,
                       token: str = ADMIN_TOKEN, signed: bool = True) -> tuple[int, Any]:
        """`call` with the body's bytes as given (JSON or not)."""
        assert self.http is not None
        url = path if path.startswith("http") else self.url + path
        headers = {**bearer(token), "Content-Type": "application/json"}
        if signed:
            headers.update(signed_headers(method, url, data))
        async with self.http.request(method, yarl.URL(url, encoded=True), data=data,
                                     headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            if "json" in reply.headers.get("Content-Type", ""):
                return reply.status, await reply.json()
            return reply.status, await reply.text()

    async def get_text(self, address: str) -> str:
        assert self.http is not None
        async with self.http.get(f"http://{address}/") as reply:
            return await reply.text()

    async def create_app(self, **fields: Any) -> dict[str, Any]:
        status, body = await self.call("POST", "/v1/apps", fields)
        assert status == 201, body
        return body  # type: ignore[no-any-return]

    def machine_count(self) -> int:
        return sum(
            1 for r in self.agents if r.agent is not None
            for m in r.agent.state.machines.values() if m.state is not MachineState.DESTROYED
        )


async def destroy_all(runtime: AgentRuntime) -> None:
    agent = runtime.agent
    if agent is None:
        return
    for mid, machine in list(agent.state.machines.items()):
        if machine.state not in (MachineState.DESTROYING, MachineState.DESTROYED):
            with contextlib.suppress(Exception):
                agent.destroy(mid)
    for mid in list(agent.state.machines):
        with contextlib.suppress(Exception):
            await agent.wait(mid, MachineState.DESTROYED, 15)


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def agent_view(machine_id: str, worker: str, state: str, app: str = "", app_uid: str = ""
               ) -> dict[str, Any]:
    """A machine as an agent answers it (agent/api.py `MachineView`), for fake agents:
    placement reads their answers as the real agent's wire type."""
    return msgspec.to_builtins(MachineView(  # type: ignore[no-any-return]
        id=machine_id, app=app, worker=worker, region="local", state=state, image="",
        image_digest="", address="", pid=0, created_at=0.0, updated_at=0.0, guest=Guest(),
        events=[], app_uid=app_uid))


def pulled(ref: str, layers: dict[str, int]) -> dict[str, Any]:
    """An agent's answer to a pull (the fields placement reads of `imagecache.api.Image`)."""
    return {"ref": ref, "digest": "sha256:" + "a" * 64,
            "layers": [{"digest": digest, "size": size} for digest, size in layers.items()]}
