"""Fixtures shared by every test package."""

from tests.support.docker_registry import docker_registry

__all__ = ["docker_registry"]
