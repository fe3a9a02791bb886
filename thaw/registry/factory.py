"""Open a registry backend from its URL: `memory` or `redis://…`."""

from __future__ import annotations

from thaw.registry.memory import MemoryRegistry
from thaw.registry.port import Registry


class UnsupportedRegistry(ValueError):
    pass


def open_registry(url: str) -> Registry:
    if url == "memory":
        return MemoryRegistry()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from thaw.registry.redis import RedisRegistry

        return RedisRegistry(url)
    from thaw.registry.access import shown

    raise UnsupportedRegistry(f"unknown registry {shown(url)!r}: use memory, "
                              "redis://[USER@]HOST:PORT/DB, rediss://… (TLS) or unix://PATH")
