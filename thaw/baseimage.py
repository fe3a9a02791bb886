"""Built-in base images (`builtin:python3`, `builtin:busybox`), built once from Debian packages.

`base_layout(name)` returns an OCI image layout holding the base, building it
the first time. Each base is keyed by the exact versions of its packages, the
recipe's version and (busybox) the hash of tinyhttp.c, so an `apt-get update`
that brings a new python3.11 makes a new base while old images keep theirs.
The cache (`$THAW_IMAGE_CACHE`, else ~/.cache/thaw/base) is shared by every
process of the user: a build holds a per-base lock and writes a temporary
layout that is renamed into place, so a concurrent builder waits and then finds
it, and a killed one leaves only a temp dir behind. Which packages a base needs
is remembered per state of apt's lists, so a cached lookup runs no apt at all.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from thaw.debroot import DebError, DebTree, Package, closure, download, versions
from thaw.ociimage import gzip_layer, image_of, write_layout

PREFIX = "builtin:"
RECIPE_VERSION = "3"  # bump when a recipe makes something else from the same packages
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STDLIB = "usr/lib/python3.11"
CACHE_TAG = "cpython-311"
TINYHTTP_C = Path(__file__).resolve().parents[1] / "loadtests" / "apps" / "tinyhttp.c"
BUSYBOX_APPLETS = (
    "sh", "ash", "cat", "cp", "mv", "ls", "id", "sleep", "mount", "umount", "mknod", "echo",
    "env", "grep", "wget", "nc", "httpd", "head", "tail", "dd", "kill", "ps", "mkdir", "rm",
    "touch", "chmod", "chown", "ln", "pwd", "sed", "test", "true", "false", "uname", "wc",
    "whoami", "hostname", "printf", "seq", "sort", "stat", "tr", "vi", "xargs",
)
PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
          "app:x:1000:1000:app:/home/app:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUP = "root:x:0:\napp:x:1000:\nnogroup:x:65534:\n"
_APT_STATE = ("/var/lib/apt/lists", "/var/lib/dpkg/status", "/etc/apt/preferences",
              "/etc/apt/preferences.d", "/etc/apt/sources.list", "/etc/apt/sources.list.d")


class BaseImageError(RuntimeError):
    """A base image could not be built (what to install is in the message)."""


@dataclass(frozen=True)
class Recipe:
    name: str
    roots: tuple[str, ...]  # packages whose Depends closure makes the userland
    follow_depends: bool
    env: tuple[str, ...]
    cmd: tuple[str, ...]
    first_build_s: int  # as measured (docs/images.md), for the progress line
    finish: Callable[[DebTree], None]  # files of our own, over the packages'
    extra_key: Callable[[], str] = lambda: ""


def skeleton(tree: DebTree) -> None:
    """Merged /usr, users, and the directories a container runtime mounts over."""
    for merged in ("bin", "sbin", "lib", "lib64"):
        tree.ensure_dir(f"usr/{merged}")
        tree.add_symlink(merged, f"usr/{merged}")
    for directory in ("etc", "dev", "proc", "sys", "run", "home", "usr/local", "usr/local/bin"):
        tree.ensure_dir(directory)
    tree.add_dir("root", 0o700)
    tree.add_dir("tmp", 0o1777)
    tree.add_dir("home/app", 0o755, 1000, 1000)
    tree.add_file("etc/passwd", PASSWD.encode())
    tree.add_file("etc/group", GROUP.encode())


def _finish_python(tree: DebTree) -> None:
    skeleton(tree)
    tree.add_symlink("usr/bin/python3", "python3.11")  # python3-minimal's link, without dpkg
    for path, source in tree.files(f"{STDLIB}/", ".py"):
        pyc = bytecode(path, source)
        if pyc is not None:
            directory, name = path.rsplit("/", 1)
            tree.ensure_dir(f"{directory}/__pycache__")
            tree.add_file(f"{directory}/__pycache__/{name[:-3]}.{CACHE_TAG}.pyc", pyc)


def bytecode(path: str, source: bytes) -> bytes | None:
    """The standard library's bytecode, made here as Debian's postinst would (py3compile):
    a machine then neither compiles its imports at every boot nor writes __pycache__ into
    its own layer. Unchecked-hash pycs (PEP 552): valid whatever mtime the unpacked files
    get. Only this host's Python 3.11 writes them (the same bytecode as the image's 3.11);
    None for a source that does not compile (test data in Python 2)."""
    if sys.version_info[:2] != (3, 11):
        return None
    try:
        code = compile(source, "/" + path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    return bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False))


def _finish_busybox(tree: DebTree) -> None:
    skeleton(tree)
    for applet in BUSYBOX_APPLETS:
        tree.add_symlink(f"usr/bin/{applet}", "busybox")
    tree.add_file("usr/local/bin/tinyhttp", compile_tinyhttp(), 0o755)


def _tinyhttp_key() -> str:
    return hashlib.sha256(TINYHTTP_C.read_bytes()).hexdigest() if TINYHTTP_C.is_file() else ""


RECIPES = {
    "python3": Recipe(
        "python3", ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib",
                    "base-files", "dash"),
        True, (f"PATH={DEFAULT_PATH}", "LANG=C.UTF-8"), ("python3",), 12, _finish_python),
    "busybox": Recipe(
        "busybox", ("busybox-static",), False, (f"PATH={DEFAULT_PATH}",), ("sh",), 2,
        _finish_busybox, _tinyhttp_key),
}


def compile_tinyhttp() -> bytes:
    """loadtests/apps/tinyhttp.c as a static binary (it must run with no libc in the image)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BaseImageError("builtin:busybox compiles tinyhttp with gcc: apt-get install gcc "
                             "libc6-dev")
    if not TINYHTTP_C.is_file():
        raise BaseImageError(f"builtin:busybox needs {TINYHTTP_C} (a checkout of thaw)")
    with tempfile.TemporaryDirectory(prefix="thaw-tinyhttp-") as temp:
        out = Path(temp) / "tinyhttp"
        done = subprocess.run([gcc, "-static", "-O2", "-o", str(out), str(TINYHTTP_C)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lacking = "libc6-dev" if "-lc" in done.stderr else "a working gcc"
            raise BaseImageError(f"gcc -static tinyhttp.c failed (install {lacking}): "
                                 f"{done.stderr.strip()[-300:]}")
        return out.read_bytes()


def cache_dir() -> Path:
    chosen = os.environ.get("THAW_IMAGE_CACHE")
    return Path(chosen) if chosen else Path.home() / ".cache" / "thaw" / "base"


def is_builtin(ref: str) -> bool:
    return ref.startswith(PREFIX)


def base_layout(name: str, *, cache: Path | None = None) -> tuple[Path, str]:
    """(OCI layout dir, tag) of the built-in base `name` ("python3" or "builtin:python3"),
    built first if this cache has none for today's package versions."""
    recipe = RECIPES.get(name.removeprefix(PREFIX))
    if recipe is None:
        known = ", ".join(PREFIX + n for n in RECIPES)
        raise BaseImageError(f"no built-in base {name!r}; there are {known}")
    root = cache or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    try:
        packages = _packages(recipe, root)
        final = root / f"{recipe.name}-{_key(recipe, packages)[:16]}"
        if not (final / "index.json").is_file():
            with _locked(root / f".{recipe.name}.lock"):
                if not (final / "index.json").is_file():
                    _build(recipe, packages, root, final)
    except DebError as exc:
        raise BaseImageError(f"{PREFIX}{recipe.name}: {exc}") from None
    return final, recipe.name


def _key(recipe: Recipe, packages: list[Package]) -> str:
    parts = [RECIPE_VERSION, recipe.name, *(p.pinned for p in packages), recipe.extra_key()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def apt_state() -> str:
    """A fingerprint of what apt would install: its lists, dpkg's status, its pins."""
    stamps: list[str] = []
    for place in _APT_STATE:
        path = Path(place)
        for item in sorted(path.iterdir()) if path.is_dir() else [path]:
            if item.is_file():
                stat = item.stat()
                stamps.append(f"{item}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(stamps).encode()).hexdigest()


def _packages(recipe: Recipe, root: Path) -> list[Package]:
    """The recipe's packages and versions, remembered per apt state (apt-cache takes ~3 s)."""
    state = apt_state()
    memo = root / f"{recipe.name}.packages.json"
    try:
        doc = json.loads(memo.read_text())
        if doc.get("apt_state") == state and doc.get("recipe") == RECIPE_VERSION:
            return [Package(n, v) for n, v in doc["packages"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    names = closure(list(recipe.roots)) if recipe.follow_depends else sorted(recipe.roots)
    packages = versions(names)
    doc = {"apt_state": state, "recipe": RECIPE_VERSION,
           "packages": [[p.name, p.version] for p in packages]}
    temp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(doc, indent=1))
    temp.replace(memo)
    return packages


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(recipe: Recipe, packages: list[Package], root: Path, final: Path) -> None:
    print(f"building base image {PREFIX}{recipe.name} from Debian packages "
          f"(once, ~{recipe.first_build_s} s)", file=sys.stderr, flush=True)
    started = time.monotonic()
    tree = DebTree()
    for deb in download(packages, root / "debs"):
        tree.add_deb(deb)
    recipe.finish(tree)
    layer, diff_id = gzip_layer(tree.tar_bytes())
    built = image_of([layer], _config_doc(recipe, packages, diff_id))
    temp = Path(tempfile.mkdtemp(prefix=f".{recipe.name}-", dir=root))
    try:
        write_layout(built, temp, "", recipe.name)
        temp.chmod(0o755)  # mkdtemp's 0700 would hide the base from other users' builds
        temp.rename(final)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"built {PREFIX}{recipe.name} in {elapsed:.1f} s: {final}", file=sys.stderr)


def _config_doc(recipe: Recipe, packages: list[Package], diff_id: str) -> dict[str, Any]:
    listed = " ".join(p.pinned for p in packages)
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": list(recipe.env), "Cmd": list(recipe.cmd)},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": f"thaw {PREFIX}{recipe.name} from Debian packages: {listed}",
                     "comment": f"thaw base recipe {RECIPE_VERSION}"}],
    }
