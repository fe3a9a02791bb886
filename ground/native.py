"""Compiled (mypyc) builds of the edge's hot modules, used only while they match the source.

    python -m ground.native build     # compile SOURCES into .native/ (make native does this)
    python -m ground.native status    # on or off, and why

The warm path runs ~40 small Python functions per proxied request; mypyc compiles
them (they are fully typed) to C, which takes a fifth to a third off their cost
(docs/benchmarks.md). The build goes to `.native/` at the repository root with a
manifest of each source's sha256. `use_native`, called from the `edge` and
`edge.core` package inits, puts the compiled directory first on the package's
`__path__` only when the manifest matches the sources on disk exactly and
`THAW_NATIVE` is not "0": an edited source is never shadowed by a stale build,
a half-finished build is never seen (it is renamed into place whole), and a
machine without a C compiler simply runs the same modules as Python.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = ROOT / ".native"
MANIFEST = "manifest.json"
SOURCES = (
    "edge/core/framing.py", "edge/core/headreader.py", "edge/core/balance.py",
    "edge/core/exchange.py", "edge/core/stats.py", "edge/core/hpack.py", "edge/core/h2wire.py",
    "edge/core/h2budget.py", "edge/core/h2send.py", "edge/core/h2peer.py", "edge/core/h2proto.py",
    "edge/exchange.py", "edge/adapters/http1.py",
    "edge/adapters/upstream.py", "edge/adapters/h2stream.py", "edge/adapters/http2.py",
    "edge/core/accesslog.py", "edge/adapters/accesslog.py",
    "edge/service.py", "edge/coldpath.py", "edge/view.py", "edge/core/forwarding.py",
    "edge/core/clients.py", "edge/core/appwake.py", "edge/core/h2head.py",
    # not on a warm HTTP/1.1 request's path, but a stream of an h2c app's exchange is an
    # `Upstream`, and an interpreted class cannot inherit from a compiled one
    "edge/adapters/h2upstream.py", "edge/adapters/h2call.py", "edge/adapters/h2pool.py",
    "edge/core/h2client.py",
    "edge/core/h2map.py",
)
DISABLE_ENV = "THAW_NATIVE"  # "0": run the pure-Python modules even when a build matches

# Run by `build` in a child process whose working directory is ROOT (mypyc names the
# modules after their paths relative to it): argv = lib dir, temp dir, sources...
_SETUP = """
import sys
from setuptools import Distribution
from mypyc.build import mypycify
lib, temp, *sources = sys.argv[1:]
dist = Distribution({"name": "thaw-native", "packages": [], "py_modules": [],
                     "ext_modules": mypycify(sources, opt_level="3", target_dir=temp)})
cmd = dist.get_command_obj("build_ext")
cmd.build_lib, cmd.build_temp, cmd.inplace = lib, temp, False
dist.run_command("build_ext")
"""


def _fingerprint() -> dict[str, object]:
    """What a build must match: the interpreter's ABI and every source's sha256."""
    return {
        "python": sys.implementation.cache_tag,
        "sources": {path: hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
                    for path in SOURCES},
    }


def decide(disable: str | None, manifest: str | None,
           current: dict[str, object]) -> tuple[bool, str]:
    """Whether a build with `manifest` (its text; None: no build) may be used for sources
    whose fingerprint is `current`, with THAW_NATIVE set to `disable`; and why."""
    if disable == "0":
        return False, f"{DISABLE_ENV}=0"
    if manifest is None:
        return False, "not built (make native)"
    try:
        built = json.loads(manifest)
    except ValueError:
        return False, "unreadable manifest (make native)"
    if not isinstance(built, dict) or built.get("python") != current["python"]:
        return False, f"built for another interpreter, running {current['python']}"
    if built.get("sources") != current["sources"]:
        return False, "sources changed since the build (make native)"
    return True, f"mypyc, {len(SOURCES)} modules"


def _manifest() -> str | None:
    try:
        return (BUILD_DIR / MANIFEST).read_text()
    except OSError:
        return None


@functools.cache
def state() -> tuple[bool, str]:
    """(whether the compiled modules are used, why) — decided once per process."""
    return decide(os.environ.get(DISABLE_ENV), _manifest(), _fingerprint())


def use_native(package: str, path: list[str]) -> None:
    """Put the compiled modules of `package` ahead of its sources, when `state()` says so."""
    if not state()[0]:
        return
    if str(BUILD_DIR) not in sys.path:
        sys.path.append(str(BUILD_DIR))  # mypyc's shared runtime is a top-level module there
    path.insert(0, str(BUILD_DIR.joinpath(*package.split("."))))


def build() -> None:
    """Compile SOURCES into a fresh directory, then swap it in whole with its manifest."""
    ROOT.joinpath("build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="native-", dir=ROOT / "build") as tmp:
        lib, temp = Path(tmp, "lib"), Path(tmp, "temp")
        fingerprint = _fingerprint()  # of the sources as they are when compiled: an edit
        subprocess.run([sys.executable, "-c", _SETUP, str(lib), str(temp), *SOURCES],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        (lib / MANIFEST).write_text(json.dumps(fingerprint, indent=1))  # meanwhile rebuilds
        old = ROOT / "build" / f"native-old-{os.getpid()}"
        if BUILD_DIR.exists():
            BUILD_DIR.rename(old)
        lib.rename(BUILD_DIR)
        shutil.rmtree(old, ignore_errors=True)
    state.cache_clear()


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    if command == "build":
        try:
            if decide(None, _manifest(), _fingerprint())[0]:
                print("native edge: up to date")
                return 0
            # (measured: 50 s for 24 modules on 2 idle cores; minutes on a loaded machine)
            print(f"compiling the native edge ({len(SOURCES)} modules with mypyc: about a "
                  "minute on 2 idle cores, longer on a loaded machine; once, then cached "
                  "until a source changes) ...", flush=True)
            began = time.monotonic()
            build()
            print(f"compiled in {time.monotonic() - began:.0f} s", flush=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"native build failed, the edge runs as pure Python: {exc}", file=sys.stderr)
            return 1
    elif command != "status":
        print("usage: python -m ground.native [build|status]", file=sys.stderr)
        return 2
    on, why = state()
    print(f"native edge: {'on' if on else 'off'} ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
