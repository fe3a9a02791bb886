"""`thaw image build`: the command line, overrides, and what ends up in the registry."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from tests.support import docker_registry as registry_support
from tests.support.docker_registry import DockerRegistry
from tests.support.ports import free_port, wait_for_port
from thaw.imagebuild import image_main, layer_tar

pytestmark = pytest.mark.integration
docker_registry = registry_support.docker_registry  # the session fixture, by name

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"


def _get(url: str, accept: str = "") -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.read()


async def test_cli_push_prints_the_manifest_digest_and_flags_override_the_toml(
    tmp_path: Path,
    docker_registry: DockerRegistry,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["build", str(HELLO), "-t", "team/hello:cli", "--push", docker_registry.url]
    argv += ["--env", "GREETING=hi", "--expose", "9000", "--cmd=--verbose"]
    assert image_main(argv) == 0
    digest = capsys.readouterr().out.strip()
    accept = "application/vnd.oci.image.manifest.v1+json"
    _, body = _get(f"{docker_registry.url}/v2/team/hello/manifests/cli", accept)
    assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
    policy = EgressPolicy.build([docker_registry.host])
    cache = ImageCache(tmp_path / "cache", budget_bytes=1 << 30, policy=policy)
    try:
        image = await cache.pull(f"{docker_registry.host}/team/hello:cli@{digest}")
    finally:
        await cache.close()
    assert image.config.entrypoint == ["python3", "app.py"]
    assert image.config.cmd == ["--verbose"]
    assert "GREETING=hi" in image.config.env and "PYTHONUNBUFFERED=1" in image.config.env
    assert image.config.exposed_ports == ["9000/tcp"]


def test_config_diff_id_is_the_sha256_of_the_uncompressed_layer(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    argv = ["build", str(HELLO), "-t", "hello:v1", "--layout", str(layout), "--from", "scratch"]
    assert image_main(argv) == 0
    index = json.loads((layout / "index.json").read_text())
    manifest_hex = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((layout / "blobs/sha256" / manifest_hex).read_text())
    config_hex = manifest["config"]["digest"].split(":")[1]
    config = json.loads((layout / "blobs/sha256" / config_hex).read_text())
    expected = "sha256:" + hashlib.sha256(layer_tar(HELLO)).hexdigest()
    assert config["rootfs"]["diff_ids"] == [expected]
    assert (config["architecture"], config["os"]) == ("amd64", "linux")


def test_build_needs_exactly_one_destination(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        image_main(["build", str(HELLO), "-t", "hello:v1"])
    assert "--layout" in capsys.readouterr().err


def _run_hello(rootfs: str, entrypoint: list[str], port: int) -> tuple[str, int]:
    env = {"PATH": "/usr/bin:/bin", "PORT": str(port), "THAW_MACHINE_ID": "m-123"}
    process = subprocess.Popen(entrypoint, cwd=rootfs, env=env)
    try:
        wait_for_port("127.0.0.1", port)
        _, health = _get(f"http://127.0.0.1:{port}/healthz")
        _, body = _get(f"http://127.0.0.1:{port}/")
        assert health == b"ok\n"
        process.send_signal(signal.SIGTERM)
        return body.decode(), process.wait(timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_pulled_hello_rootfs_runs_its_entrypoint_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    layout = tmp_path / "layout"
    # from scratch: the host's python runs it (tests/integration/test_image_bases.py runs
    # hello on its own interpreter)
    argv = ["build", str(HELLO), "-t", "hello:v1", "--layout", str(layout), "--from", "scratch"]
    assert image_main(argv) == 0
    policy = EgressPolicy.build(layout_dirs=[str(tmp_path)])
    cache = ImageCache(tmp_path / "cache", budget_bytes=1 << 30, policy=policy)
    try:
        image = await cache.pull(f"oci:{layout}:v1")
    finally:
        await cache.close()
    body, status = await asyncio.to_thread(
        _run_hello, image.rootfs, image.config.entrypoint, free_port()
    )
    assert body == "hello from m-123\n"
    assert status == 0
