"""How long a first `make up` takes on a fresh clone, three ways: on the pure-Python edge
with nothing compiled; on the pure-Python edge while the native edge compiles beside it
at nice 19 (what `make up` does when no build matches); and compiling first, then
starting on the native edge (what `make up` did before).

    python loadtests/bench_first_start.py [--rounds 1] [--repo .]

It clones HEAD of --repo into a temp dir, makes the clone's venv once (timed: the same
for every way), then for each way and round: a fresh state dir and a fresh base-image
cache (so examples/hello's base is built as on a first run), `thaw up` on free ports,
the seconds until its banner and until the first answer from `hello` (a cold start).
Everything it starts it stops; the temp dir is removed unless --keep.
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.ports import free_ports


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    began = time.monotonic()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.monotonic() - began


def first_answer(port: int, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", "/", headers={"Host": "hello.localhost"})
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("hello never answered")


def start_up(clone: Path, work: Path, native: bool) -> tuple[float, float]:
    """(seconds to the banner, seconds to hello's first answer) of one `thaw up`."""
    state = Path(tempfile.mkdtemp(prefix="state-", dir=work))
    edge, api, admin = free_ports(3)
    env = {**os.environ, "THAW_IMAGE_CACHE": str(state / "base-cache"),
           "THAW_CONFIG": str(state / "cli"), "THAW_LOG_LEVEL": "warning"}
    if not native:
        env["THAW_NATIVE"] = "0"
    began = time.monotonic()
    proc = subprocess.Popen(
        [str(clone / ".venv/bin/thaw"), "up", "--state-dir", str(state / "s"),
         "--edge-port", str(edge), "--api-port", str(api), "--admin-port", str(admin)],
        cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        assert proc.stdout is not None
        out = b""
        while b"curl -H" not in out:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"thaw up ended:\n{out.decode()}")
            out += line
        banner = time.monotonic() - began
        if (b"native edge on" in out) != native:
            raise RuntimeError(f"expected native={native}:\n{out.decode()}")
        first_answer(edge)
        return banner, time.monotonic() - began
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="thaw-first-start-"))
    clone = work / "thaw"
    try:
        subprocess.run(["git", "clone", "-q", str(args.repo), str(clone)], check=True)
        venv_s = run(["make", "venv"], clone)
        print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}")
        print(f"make venv (once, the same for every way): {venv_s:.0f} s", flush=True)
        native = clone / ".native"
        for n in range(args.rounds):
            shutil.rmtree(native, ignore_errors=True)
            banner, answer = start_up(clone, work, native=False)
            print(f"round {n + 1} pure Python, nothing compiled: banner {banner:.1f} s, "
                  f"first answer {answer:.1f} s", flush=True)
            build = subprocess.Popen(["nice", "-n", "19", str(clone / ".venv/bin/python"),
                                      "-m", "ground.native", "build"], cwd=clone,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            began = time.monotonic()
            banner, answer = start_up(clone, work, native=False)
            build.wait()
            print(f"round {n + 1} pure Python, compiling beside at nice 19: banner "
                  f"{banner:.1f} s, first answer {answer:.1f} s (the compile took "
                  f"{time.monotonic() - began:.0f} s)", flush=True)
            shutil.rmtree(native, ignore_errors=True)
            compile_s = run([str(clone / ".venv/bin/python"), "-m", "ground.native", "build"],
                            clone)
            banner, answer = start_up(clone, work, native=True)
            print(f"round {n + 1} compile first, then native: compile {compile_s:.0f} s, "
                  f"then banner {banner:.1f} s, first answer {answer:.1f} s; from make up: "
                  f"{compile_s + banner:.1f} s and {compile_s + answer:.1f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
