"""Fixtures shared by every test package."""

import os
from collections.abc import Iterator

import pytest

from tests.support.docker_registry import docker_registry
from tests.support.egress import trap, trap6
from tests.support.machines import sweep
from tests.support.placement_helpers import hello_layout
from tests.support.redis_server import redis_own, redis_server

__all__ = ["docker_registry", "hello_layout", "redis_own", "redis_server", "trap", "trap6"]


@pytest.fixture(scope="session", autouse=True)
def no_cli_context_of_the_user(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The CLI run by tests reads and writes contexts of the session's own, never the
    user's ~/.config/thaw (whose current one may point at a `make up` of theirs)."""
    os.environ["THAW_CONFIG"] = str(tmp_path_factory.mktemp("cli-config"))


@pytest.fixture(scope="session", autouse=True)
def no_machine_left_on_the_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the session, whatever machines any agent of it left on the host (a test that
    failed half way, a host it killed) are swept: containers, mounts, network namespaces
    and claims live outside its temp dirs."""
    yield
    base = tmp_path_factory.getbasetemp()
    for pattern in ("*/runtime", "*/*/runtime", "*/*/*/runtime", "*/*/*/*/runtime"):
        for runtime in base.glob(pattern):
            if (runtime.parent / "oplog").exists():
                sweep(runtime.parent)
