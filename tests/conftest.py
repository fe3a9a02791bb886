"""Fixtures shared by every test package."""

from tests.support.docker_registry import docker_registry
from tests.support.egress import trap, trap6
from tests.support.placement_helpers import hello_layout
from tests.support.redis_server import redis_server

__all__ = ["docker_registry", "hello_layout", "redis_server", "trap", "trap6"]
