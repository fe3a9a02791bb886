"""A real Distribution v2 registry (Debian `docker-registry`) for integration tests.

`start_docker_registry()` is a context manager; `docker_registry` is a
session-scoped fixture built on it. Import the fixture into a test module with
`from tests.support.docker_registry import docker_registry  # noqa: F401`.
The process is killed by PID and reaped; its storage dir is removed.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.ports import free_port

REGISTRY_BIN = "/usr/bin/docker-registry"

_CONFIG = """\
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


@dataclass(frozen=True)
class DockerRegistry:
    port: int
    pid: int

    @property
    def host(self) -> str:
        """host:port, as it appears in image references."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/v2/", timeout=0.5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"docker-registry at {url} not ready in {timeout_s}s")
        time.sleep(0.05)


@contextlib.contextmanager
def start_docker_registry() -> Iterator[DockerRegistry]:
    """Start docker-registry on a free loopback port with storage in a temp dir."""
    if not Path(REGISTRY_BIN).exists():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    workdir = Path(tempfile.mkdtemp(prefix="thaw-registry-"))
    port = free_port()
    config = workdir / "config.yml"
    config.write_text(_CONFIG.format(storage=workdir / "storage", port=port))
    log = open(workdir / "registry.log", "wb")  # noqa: SIM115 - closed in finally
    process = subprocess.Popen(
        [REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        registry = DockerRegistry(port=port, pid=process.pid)
        _wait_ready(registry.url, process)
        yield registry
    finally:
        process.kill()
        process.wait(timeout=10)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_registry() -> Iterator[DockerRegistry]:
    with start_docker_registry() as registry:
        yield registry
