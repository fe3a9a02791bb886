"""Built-in bases and FROM: images that carry their own userland, proven by chroot.

The bases are built once per cache (~/.cache/thaw/base, or $THAW_IMAGE_CACHE) and
found there on later runs; each image is pulled through the image cache, whose
checks of tar members and symlinks the bases must pass, and run with nothing of
the host's but its kernel.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from imagecache.api import Image
from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.errors import ImageError
from tests.support import docker_registry as registry_support
from tests.support.docker_registry import DockerRegistry
from tests.support.ports import free_port, wait_for_port
from thaw.baseimage import base_layout
from thaw.imagebuild import build_image, image_main

pytestmark = [pytest.mark.integration, pytest.mark.slow]
docker_registry = registry_support.docker_registry  # the session fixture, by name
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
IMPORTS = "import http.server, json, ssl, sqlite3, ctypes, socket, hashlib, email"


def pull(tmp_path: Path, ref: str, registries: tuple[str, ...] = (),
         layouts: tuple[Path, ...] = ()) -> Image:
    """`ref` pulled and unpacked by the image cache, as an agent would."""
    async def pulled() -> Image:
        allowed = [str(tmp_path), *(str(p) for p in layouts)]
        policy = EgressPolicy.build(registries, layout_dirs=allowed)
        cache = ImageCache(tmp_path / "cache", budget_bytes=1 << 30, policy=policy)
        try:
            return await cache.pull(ref)
        finally:
            await cache.close()

    return asyncio.run(pulled())


def chroot(rootfs: str, *argv: str, env: dict[str, str] | None = None) -> str:
    # no .pyc written into the cache's rootfs: a machine's rootfs is read-only
    chosen = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    done = subprocess.run([CHROOT, rootfs, *argv], capture_output=True, text=True,
                          env=chosen, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def layout_config(layout: Path, ref_name: str) -> tuple[dict, dict]:  # type: ignore[type-arg]
    index = json.loads((layout / "index.json").read_text())
    entry = next(m for m in index["manifests"]
                 if m["annotations"]["org.opencontainers.image.ref.name"] == ref_name)
    manifest = json.loads((layout / "blobs/sha256" / entry["digest"][7:]).read_text())
    config = json.loads((layout / "blobs/sha256" / manifest["config"]["digest"][7:]).read_text())
    return manifest, config


def test_python3_base_is_built_once_and_then_found_in_the_cache() -> None:
    layout, tag = base_layout("builtin:python3")
    index = (layout / "index.json").stat()
    assert base_layout("builtin:python3") == (layout, tag)
    assert (layout / "index.json").stat().st_mtime_ns == index.st_mtime_ns  # not built again
    manifest, config = layout_config(layout, tag)
    assert len(manifest["layers"]) == 1
    assert config["config"]["Cmd"] == ["python3"]
    assert "LANG=C.UTF-8" in config["config"]["Env"]


@needs_root
def test_the_python3_base_carries_its_stdlibs_bytecode_so_a_machine_writes_none(
        tmp_path: Path) -> None:
    base, tag = base_layout("builtin:python3")
    image = pull(tmp_path, f"oci:{base}:{tag}", layouts=(base,))
    pyc = Path(image.rootfs) / "usr/lib/python3.11/http/__pycache__/server.cpython-311.pyc"
    assert pyc.is_file()
    before = {p for p in Path(image.rootfs).rglob("*.pyc")}
    done = subprocess.run([CHROOT, image.rootfs, "python3", "-c", IMPORTS],
                          env={"PATH": "/usr/bin"}, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert {p for p in Path(image.rootfs).rglob("*.pyc")} == before  # nothing compiled


@needs_root
def test_hello_from_python3_runs_on_its_own_interpreter_in_a_chroot(
        tmp_path: Path) -> None:
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    image = pull(tmp_path, f"oci:{tmp_path / 'layout'}:hello:v1")
    assert image.config.working_dir == "/app"
    assert chroot(image.rootfs, "python3", "-c", f"{IMPORTS}; print('ok')") == "ok\n"
    port = free_port()
    env = {"PATH": "/usr/bin", "PORT": str(port), "THAW_MACHINE_ID": "m-1"}
    app = subprocess.Popen([CHROOT, image.rootfs, "sh", "-c", "cd /app && exec python3 app.py"],
                           env=env)
    try:
        wait_for_port("127.0.0.1", port, alive=lambda: app.poll() is None)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert conn.makefile("rb").read().endswith(b"hello from m-1\n")
    finally:
        app.terminate()
        app.wait(timeout=10)


def test_from_a_base_reuses_its_layer_blobs_byte_for_byte(tmp_path: Path) -> None:
    base, tag = base_layout("builtin:python3")
    build_image(HELLO, "hello:v1", layout=tmp_path / "layout")
    base_manifest, base_config = layout_config(base, tag)
    manifest, config = layout_config(tmp_path / "layout", "hello:v1")
    assert manifest["layers"][:1] == base_manifest["layers"]
    assert config["rootfs"]["diff_ids"][:1] == base_config["rootfs"]["diff_ids"]
    assert [h["created_by"] for h in config["history"]][1:] == ["thaw image build: COPY . /app"]


@needs_root
def test_busybox_base_is_a_static_userland_with_tinyhttp(tmp_path: Path) -> None:
    layout, tag = base_layout("builtin:busybox")
    image = pull(tmp_path, f"oci:{layout}:{tag}", layouts=(layout,))
    out = chroot(image.rootfs, "/bin/busybox", "sh", "-c", "id -u app; cat /etc/os-release "
                 "2>/dev/null || echo no-os-release; ls -ld /tmp | cut -c1-10")
    assert out.split() == ["1000", "no-os-release", "drwxrwxrwt"]
    port = free_port()
    server = subprocess.Popen([CHROOT, image.rootfs, "/usr/local/bin/tinyhttp"],
                              env={"PORT": str(port), "THAW_MACHINE_ID": "m-2"})
    try:
        wait_for_port("127.0.0.1", port, alive=lambda: server.poll() is None)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"tiny m-2" in conn.recv(4096)
    finally:
        server.terminate()
        server.wait(timeout=10)


@needs_root
def test_dockerfile_from_busybox_copies_with_chown_and_sets_the_config(
        tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    (context / "bin").mkdir(parents=True)
    (context / "bin" / "serve").write_text("#!/bin/sh\necho serving as $(id -u) in $(pwd)\n")
    (context / "bin" / "serve").chmod(0o755)
    (context / "notes.md").write_text("not copied\n")
    (context / ".dockerignore").write_text("*.md\n")
    (context / "Dockerfile").write_text(
        "FROM builtin:busybox\nWORKDIR /srv\nCOPY . .\nCOPY --chown=app:app bin/ ./bin/\n"
        'USER app\nENV GREETING=hi\nEXPOSE 9000\nSTOPSIGNAL SIGINT\nCMD ["bin/serve"]\n')
    build_image(context, "serve:v1", layout=tmp_path / "layout")
    image = pull(tmp_path, f"oci:{tmp_path / 'layout'}:serve:v1")
    config = image.config
    assert (config.working_dir, config.user, config.stop_signal, config.cmd) == (
        "/srv", "app", "SIGINT", ["bin/serve"])
    assert "GREETING=hi" in config.env and config.exposed_ports == ["9000/tcp"]
    out = chroot(image.rootfs, "/bin/busybox", "sh", "-c", "cd /srv && ls && bin/serve")
    assert out.split() == ["Dockerfile", "bin", "serving", "as", "0", "in", "/srv"]
    # The owner is in the layer; the image cache unpacks every file as its own user.
    manifest, _ = layout_config(tmp_path / "layout", "serve:v1")
    top = (tmp_path / "layout/blobs/sha256" / manifest["layers"][-1]["digest"][7:]).read_bytes()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(top))) as archive:
        owners = {m.name: (m.uid, m.gid) for m in archive}
    assert owners == {"srv/bin": (1000, 1000), "srv/bin/serve": (1000, 1000)}


def test_dockerfile_errors_name_the_file_and_line_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n# build it\nRUN make\n")
    argv = ["build", str(tmp_path), "-t", "x:v1", "--layout", str(tmp_path / "layout")]
    assert image_main(argv) == 1
    assert capsys.readouterr().err == ("thaw image build: Dockerfile:3: RUN needs a container "
                                       "to run in; not supported by thaw image build yet\n")
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY missing.txt /\n")
    assert image_main(argv) == 1
    assert capsys.readouterr().err == (
        "thaw image build: Dockerfile:2: missing.txt: not found in the build context\n")


def test_push_sends_the_base_layers_and_a_registry_image_can_be_a_base(
        tmp_path: Path, docker_registry: DockerRegistry) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "hello.sh").write_text("echo hello\n")
    (app / "thaw-image.toml").write_text('from = "builtin:busybox"\ncmd = ["sh", "hello.sh"]\n')
    build_image(app, "base/hello:v1", push=docker_registry.url)
    child = tmp_path / "child"
    child.mkdir()
    (child / "Dockerfile").write_text(f"FROM {docker_registry.host}/base/hello:v1\n"
                                      "COPY extra.txt /app/\n")
    (child / "extra.txt").write_text("more\n")
    digest = build_image(child, "child:v1", push=docker_registry.url)
    image = pull(tmp_path, f"{docker_registry.host}/child:v1@{digest}",
                       (docker_registry.host,))
    assert image.config.cmd == ["sh", "hello.sh"] and image.config.working_dir == "/app"
    assert len(image.layers) == 3
    assert sorted(os.listdir(Path(image.rootfs) / "app")) == ["extra.txt", "hello.sh"]


def test_an_oci_layout_can_be_a_base_and_the_cli_takes_from(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    (base_dir / "base.txt").write_text("base\n")
    layout = tmp_path / "layout"
    assert image_main(["build", str(base_dir), "-t", "base:v1", "--layout", str(layout),
                       "--from", "builtin:busybox", "--workdir", "/opt"]) == 0
    capsys.readouterr()
    app = tmp_path / "app"
    app.mkdir()
    (app / "app.txt").write_text("app\n")
    assert image_main(["build", str(app), "-t", "app:v1", "--layout", str(layout),
                       "--from", f"oci:{layout}:base:v1"]) == 0
    manifest, config = layout_config(layout, "app:v1")
    assert len(manifest["layers"]) == 3
    assert config["config"]["WorkingDir"] == "/opt"  # inherited: the app went there too


def test_two_apps_keep_their_own_tags_in_one_layout(tmp_path: Path) -> None:
    for name in ("hello", "greet"):
        app = tmp_path / name
        app.mkdir()
        (app / "who").write_text(name)
        build_image(app, f"{name}:v1", layout=tmp_path / "layout")
    greet = pull(tmp_path, f"oci:{tmp_path / 'layout'}:greet:v1")
    assert (Path(greet.rootfs) / "who").read_text() == "greet"
    with pytest.raises(ImageError, match="ambiguous"):
        pull(tmp_path, f"oci:{tmp_path / 'layout'}:v1")


def test_a_layout_written_before_names_were_kept_is_still_read(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "who").write_text("old")
    odd = tmp_path / "lay:out"  # a layout dir with a colon in its name, tagged the old way
    build_image(app, "old:v1", layout=odd)
    index = json.loads((odd / "index.json").read_text())
    index["manifests"][0]["annotations"] = {"org.opencontainers.image.ref.name": "v1"}
    (odd / "index.json").write_text(json.dumps(index))
    image = pull(tmp_path, f"oci:{odd}:v1")
    assert (Path(image.rootfs) / "who").read_text() == "old"
    build_image(app, "old:v1", layout=odd)  # replaces the bare "v1" it was before
    names = [m["annotations"]["org.opencontainers.image.ref.name"]
             for m in json.loads((odd / "index.json").read_text())["manifests"]]
    assert names == ["old:v1"]


def test_concurrent_first_builds_of_a_base_share_one_result(tmp_path: Path) -> None:
    code = "from thaw.baseimage import base_layout; print(base_layout('builtin:busybox')[0])"
    env = {**os.environ, "THAW_IMAGE_CACHE": str(tmp_path / "cache")}
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [run.communicate(timeout=120) for run in runs]
    assert all(run.returncode == 0 for run in runs), results
    assert len({out for out, _ in results}) == 1
    built = [err for _, err in results if "building base image builtin:busybox" in err]
    assert len(built) == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()
                  if not p.name.startswith(".") and p.is_dir()) == sorted([
        "debs", Path(results[0][0].strip()).name])
