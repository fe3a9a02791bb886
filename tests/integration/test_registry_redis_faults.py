"""The Redis backend when Redis dies: clear errors, no hang, recovery after restart."""

from __future__ import annotations

import pytest

from tests.support.redis_server import start_redis_server
from thaw.registry import WorkerStatus
from thaw.registry.redis import RedisRegistry, RegistryUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_calls_fail_with_registry_unavailable_when_redis_is_killed() -> None:
    with start_redis_server() as server:
        registry = RedisRegistry(server.url, timeout_s=0.5)
        status = WorkerStatus(id="w1", epoch=1, region="local", url="http://w1",
                              cpus=1, memory_mb=1)
        await registry.publish_worker(status, ttl_s=5)
        assert [w.id for w in await registry.workers()] == ["w1"]
    # the server is killed (SIGKILL) when the context exits
    with pytest.raises(RegistryUnavailable):
        await registry.workers()
    with pytest.raises(RegistryUnavailable):
        await registry.publish_worker(status, ttl_s=5)
    await registry.close()
