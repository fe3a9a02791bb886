"""An app stored while the registry would not take its copy: the owner's call succeeds
(the store, the truth, has it) and the copy is published as soon as the registry takes
it, without a loss or a restart (placement/fleet/republish.py `publish`, `owed`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.appconfig import AppConfig
from ground.registry.memory import MemoryRegistry
from placement.errors import Unavailable
from tests.support.placement_helpers import Platform, eventually, hello_layout  # noqa: F401

pytestmark = pytest.mark.integration


class Refusing(MemoryRegistry):
    """The memory registry, refusing app copies while `refusing` (as a Redis whose pool
    is dry would)."""

    refusing = False

    async def put_app(self, config: AppConfig) -> None:
        if self.refusing:
            raise Unavailable("redis: No connection available", code="registry_unavailable")
        await super().put_app(config)


async def test_an_app_stored_when_the_registry_refused_its_copy_is_published_later(
    tmp_path: Path, hello_layout: str  # noqa: F811
) -> None:
    registry = Refusing()
    async with Platform(tmp_path, agents=1, registry=registry) as p:
        registry.refusing = True
        status, body = await p.call("POST", "/v1/apps", {"name": "owed", "image": hello_layout})
        assert status == 201, body
        status, body = await p.call("PATCH", "/v1/apps/owed", {"idle_timeout_s": 77})
        assert status == 200, body
        assert await registry.app("owed") is None
        registry.refusing = False

        async def published() -> bool:
            copy = await registry.app("owed")
            return copy is not None and copy.idle_timeout_s == 77

        await eventually(published, timeout_s=10)
