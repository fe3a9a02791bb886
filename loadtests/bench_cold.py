"""Cold start overhead and resume from suspend per driver, through `thaw up`, on loopback;
and a machine's start at the driver: a created (pre-created) container against a full
create.

    .venv/bin/python loadtests/bench_cold.py [--rounds 20] [--creates 20]

1. Platforms: one `thaw up` (1 agent) per driver that can run here -- bubblewrap (the
   driver before containers), the OCI driver with runc, and with crun -- each serving two
   apps: `hello` (examples/hello: stdlib http.server on the image's own Python) and
   `tiny` (tinyhttp, a static C server, on the busybox base).
2. Rounds, interleaved: in each round, for every platform and app in turn: the app's
   machine is stopped through the API; the app's own boot is timed (its image's binary
   run directly on this host in a chroot of the image's tree, spawn to first accepted
   connection); then one request through the edge, time to first byte. Overhead =
   TTFB - that boot. Then the machine is suspended and one request times the resume.
3. Driver starts (in this process, no edge): for each image, interleaved, the OCI
   driver's launch of a machine prepared ahead (a created container: the runtime's
   `start`) against a full create (a machine without a container, rootfs or network:
   mount, namespace, runtime `create`, then `start`), and bubblewrap's launch.
Figures: p50/p99 (ms) over all rounds; written to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.benchlib import free_port, machine_line, median, percentile, write_section
from tests.support.agent_process import call
from tests.support.platform import ThawUp
from thaw.imagebuild import BuildOverrides, build_image

APPS = ("hello", "tiny")
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
DRIVERS = (("bubblewrap", ["--driver", "bubblewrap"]), ("runc", ["--driver", "oci"]),
           ("crun", ["--driver", "oci", "--runtime", "crun"]))


class Platform:
    """One `thaw up` with one agent under one driver, serving `hello` and `tiny`."""

    def __init__(self, name: str, flags: list[str], work: Path, tiny_image: str) -> None:
        self.name = name
        self.up = ThawUp(work / name, agents=1, hello=["idle_timeout_s=3600"],
                         extra=[*flags, "--allow-layout", str(work)])
        self.tiny_image = tiny_image
        self.error = ""

    def start(self) -> bool:
        try:
            self.up.start()
            status, body = call("POST", f"{self.up.api}/v1/apps", {
                "name": "tiny", "image": self.tiny_image, "idle_timeout_s": 3600,
                "guest": {"cpus": 0.25, "memory_mb": 64}}, token=self.up.token)
            assert status == 201, body
            for app in APPS:  # pulled, unpacked and booted once before measuring
                _, status, _ = ttfb(self.up.edge_port, app)
                if status != 200:
                    raise RuntimeError(f"{app}: first request answered {status}: "
                                       f"{self.why_not(app)}")
        except (RuntimeError, AssertionError) as exc:
            self.error = str(exc).strip().splitlines()[-1][:400]
            self.up.cleanup()
            return False
        return True

    def why_not(self, app: str) -> str:
        """The last reason one of the app's machines gave (a failed start's)."""
        _, machines = call("GET", f"{self.up.api}/v1/apps/{app}/machines", token=self.up.token)
        reasons = [e["reason"] for m in machines for e in m.get("events", []) if e["reason"]]
        return reasons[-1].splitlines()[0][:300] if reasons else "no reason given"

    def machine(self, app: str) -> dict[str, Any]:
        _, machines = call("GET", f"{self.up.api}/v1/apps/{app}/machines", token=self.up.token)
        live = [m for m in machines if m["state"] != "destroyed"]
        assert len(live) == 1, live
        return live[0]  # type: ignore[no-any-return]

    def settle(self, app: str, action: str, target: str) -> dict[str, Any]:
        machine = self.machine(app)
        base = f"{self.up.api}/v1/apps/{app}/machines/{machine['id']}"
        status, body = call("POST", f"{base}/{action}", token=self.up.token)
        assert status == 200, body
        status, body = call("GET", f"{base}/wait?state={target}&timeout_s=20", timeout_s=30,
                            token=self.up.token)
        assert status == 200, body
        # The edge's view hears of it through the change feed, and a stopped OCI machine is
        # created again (~70 ms after its stop): a cold request comes long after a stop.
        time.sleep(0.5 if action == "stop" else 0.05)
        return machine

    def rootfs(self, machine: dict[str, Any]) -> Path:
        digest = machine["image_digest"].split(":", 1)[1]
        return self.up.state_dir / "agent-0" / "images" / "rootfs" / digest


def ttfb(port: int, app: str) -> tuple[float, int, str]:
    """(ms to the first response byte, status, Server-Timing) of one GET through the edge."""
    request = f"GET / HTTP/1.1\r\nHost: {app}.localhost\r\nConnection: close\r\n\r\n".encode()
    began = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        first = sock.recv(1)
        elapsed = (time.perf_counter() - began) * 1000
        data = first
        while chunk := sock.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode()
    timing = re.search(r"(?im)^server-timing:\s*(.+)$", head)
    return elapsed, int(head.split()[1]), timing.group(1).strip() if timing else ""


def boot_in_chroot(rootfs: Path, argv: list[str], workdir: str) -> float:
    """Spawn-to-first-accept (ms) of the image's own binary in a chroot of its tree."""
    port = free_port()
    env = {"PORT": str(port), "PATH": "/usr/local/bin:/usr/bin:/bin", "THAW_MACHINE_ID": "b",
           "PYTHONDONTWRITEBYTECODE": "1"}  # the image's tree is the cache's: never written
    began = time.perf_counter()
    proc = subprocess.Popen([CHROOT, str(rootfs), "sh", "-c",
                             f"cd {workdir} && exec {' '.join(argv)}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return (time.perf_counter() - began) * 1000
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"{argv} exited {proc.returncode} in {rootfs}") from None
                time.sleep(0.0005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


BOOT = {"hello": (["python3", "app.py"], "/app"), "tiny": (["tinyhttp"], "/")}


def rounds(platforms: list[Platform], count: int) -> dict[tuple[str, str, str], list[float]]:
    """(driver, app, measure) -> values, rounds interleaved across drivers and apps."""
    found: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(count):
        for platform in platforms:
            for app in APPS:
                machine = platform.settle(app, "stop", "stopped")
                argv, workdir = BOOT[app]
                boot = boot_in_chroot(platform.rootfs(machine), argv, workdir)
                cold, status, timing = ttfb(platform.up.edge_port, app)
                assert status == 200, (platform.name, app, status)
                for part, dur in re.findall(r"(\w+);dur=([\d.]+)", timing):
                    found.setdefault((platform.name, app, f"timing {part}"), []).append(
                        float(dur))
                platform.settle(app, "suspend", "suspended")
                resumed, status, _ = ttfb(platform.up.edge_port, app)
                assert status == 200, (platform.name, app, status)
                for measure, value in (("boot", boot), ("cold", cold),
                                       ("overhead", cold - boot), ("resume", resumed)):
                    found.setdefault((platform.name, app, measure), []).append(value)
    return found


def driver_starts(work: Path, rootfs: dict[str, Path], count: int
                  ) -> dict[tuple[str, str], list[float]]:
    """(way, app) -> ms of a launch call: OCI prepared, OCI full create, bubblewrap."""
    return asyncio.run(_driver_starts(work, rootfs, count))


async def _driver_starts(work: Path, rootfs: dict[str, Path], count: int
                         ) -> dict[tuple[str, str], list[float]]:
    from agent.driverport import LaunchSpec
    from agent.ocidriver import OciDriver
    from agent.outputs import Outputs
    from agent.sandboxdriver import ProcessMachines

    state = work / "driver-state"
    (state / "machines").mkdir(parents=True, mode=0o700)
    oci = OciDriver(state)  # the default run dir (/run/thaw), walkable by machines' ids
    bwrap = ProcessMachines(sandbox=True)
    outputs = Outputs()
    found: dict[tuple[str, str], list[float]] = {}

    def spec(app: str, n: int) -> LaunchSpec:
        mid = f"{app[:4]}{n:010d}"
        directory = state / "machines" / mid
        directory.mkdir(mode=0o700, exist_ok=True)
        outputs.ensure(mid, directory)
        argv, workdir = BOOT[app]
        return LaunchSpec(mid, app, argv, {"PATH": "/usr/local/bin:/usr/bin:/bin",
                                            "PORT": "8080"}, rootfs[app], workdir, "", 8080,
                          0.5, 128, directory)

    async def timed(key: tuple[str, str], launch: Awaitable[Any]) -> Any:
        began = time.perf_counter()
        run = await launch
        found.setdefault(key, []).append((time.perf_counter() - began) * 1000)
        return run

    try:
        await _each_way(oci, bwrap, spec, timed, count)
    finally:
        await oci.sweep(state / "machines")  # whatever a failed round left on the host
        outputs.close_all()
    return found


async def _each_way(oci: Any, bwrap: Any, spec: Any, timed: Any, count: int) -> None:
    n = 0
    for _ in range(count):
        for app in APPS:
            n += 1
            prepared = spec(app, n)
            await oci.prepare(prepared)
            run = await timed(("oci prepared: start", app), oci.launch(prepared))
            await oci.stop(run, signal.SIGKILL, 1)
            await oci.destroy(prepared.machine_id, prepared.machine_dir)
            n += 1
            fresh = spec(app, n)
            run = await timed(("oci full create + start", app), oci.launch(fresh))
            await oci.stop(run, signal.SIGKILL, 1)
            await oci.destroy(fresh.machine_id, fresh.machine_dir)
            n += 1
            plain = spec(app, n)
            run = await timed(("bubblewrap launch", app), bwrap.launch(plain))
            await bwrap.stop(run, signal.SIGKILL, 1)


def build_tiny(work: Path) -> str:
    source = work / "tiny-src"
    source.mkdir()
    (source / "README").write_text("tinyhttp on the busybox base\n")
    build_image(source, "tiny:v1", layout=work / "layout", overrides=BuildOverrides(
        base="builtin:busybox", entrypoint=["tinyhttp"]))
    return f"oci:{work / 'layout'}:tiny:v1"


def row(name: str, values: list[float]) -> str:
    return f"| {name} | {median(values):.1f} | {percentile(values, 99):.1f} | {len(values)} |"


def report(args: argparse.Namespace, platforms: list[Platform], failed: list[Platform],
           found: dict[tuple[str, str, str], list[float]],
           starts: dict[tuple[str, str], list[float]]) -> str:
    lines = ["## Cold start and resume per driver (`loadtests/bench_cold.py`)", "",
             f"Command: `python loadtests/bench_cold.py {' '.join(sys.argv[1:])}`  ",
             f"Machine: {machine_line()}  ",
             f"`thaw up` with 1 agent per driver, {args.rounds} rounds interleaved across "
             "drivers and apps; image cached; each cold start follows a stop through the "
             "API (under the OCI driver a stopped machine is a created container). Boot = "
             "the image's own binary in a chroot of its tree, spawn to first accept, timed "
             "just before.", "",
             "| driver · app · measure (ms) | p50 | p99 | runs |", "|---|---|---|---|"]
    for platform in platforms:
        for app in APPS:
            for measure, words in (("boot", "app boot alone"), ("cold", "cold TTFB"),
                                   ("overhead", "cold overhead = TTFB - boot"),
                                   ("resume", "TTFB after suspend (resume)")):
                lines.append(row(f"{platform.name} · {app} · {words}",
                                 found[(platform.name, app, measure)]))
    lines += ["", "Server-Timing of the cold requests, p50 (ms):", ""]
    for platform in platforms:
        for app in APPS:
            parts = {key[2][7:]: median(values) for key, values in found.items()
                     if key[:2] == (platform.name, app) and key[2].startswith("timing ")}
            lines.append(f"- {platform.name} · {app}: "
                         + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    for platform in failed:
        lines.append(f"\n- {platform.name}: cannot run here: `{platform.error}`")
    lines += ["", "Driver starts, in-process, no edge (launch call to return; the app's boot "
              "not included):", "", "| way · app (ms) | p50 | p99 | runs |", "|---|---|---|---|"]
    for (way, app), values in sorted(starts.items()):
        lines.append(row(f"{way} · {app}", values))
    lines += ["", *targets(found, starts)]
    return "\n".join(lines)


def targets(found: dict[tuple[str, str, str], list[float]],
            starts: dict[tuple[str, str], list[float]]) -> list[str]:
    out = []
    for app in APPS:
        base, oci = found.get(("bubblewrap", app, "overhead")), found.get(("runc", app, "overhead"))
        if base and oci:
            added = median(oci) - median(base)
            out.append(f"- {app}: runc's cold overhead - bubblewrap's, p50: {added:+.1f} ms "
                       f"(target ≤ 15): {'met' if added <= 15 else 'NOT met'}")
        full = starts.get(("oci full create + start", app))
        if full:
            out.append(f"- {app}: a full create + start, p50 {median(full):.1f} ms (target "
                       f"≤ 60): {'met' if median(full) <= 60 else 'NOT met'}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-cold-"))
    platforms: list[Platform] = []
    failed: list[Platform] = []
    try:
        tiny = build_tiny(work)
        for name, flags in DRIVERS:
            platform = Platform(name, flags, work, tiny)
            (platforms if platform.start() else failed).append(platform)
        found = rounds(platforms, args.rounds)
        oci = next(p for p in platforms if p.name == "runc")
        rootfs = {app: oci.rootfs(oci.machine(app)) for app in APPS}
        starts = driver_starts(work, rootfs, args.creates)
    finally:
        for platform in platforms:
            platform.up.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    text = report(args, platforms, failed, found, starts)
    print(text)
    if not args.no_write:
        write_section("cold", text)


if __name__ == "__main__":
    os.environ.setdefault("THAW_LOG_LEVEL", "warning")
    main()
