"""Open a registry backend from its URL: `memory` or `redis://…`."""

from __future__ import annotations

from ground.registry.memory import MemoryRegistry
from ground.registry.port import Registry


class UnsupportedRegistry(ValueError):
    pass


def open_registry(url: str) -> Registry:
    if url == "memory":
        return MemoryRegistry()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from ground.registry.redis import RedisRegistry

        return RedisRegistry(url)
    from ground.registry.access import shown

    raise UnsupportedRegistry(f"unknown registry {shown(url)!r}: use memory, "
                              "redis://[USER@]HOST:PORT/DB, rediss://… (TLS) or unix://PATH")
