"""Fixtures shared by every test package."""

from tests.support.docker_registry import docker_registry
from tests.support.redis_server import redis_server

__all__ = ["docker_registry", "redis_server"]
