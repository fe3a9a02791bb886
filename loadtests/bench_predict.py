"""The wake prediction's error: placement's predicted first-ready time against the actual.

    .venv/bin/python loadtests/bench_predict.py [--restarts 10] [--firsts 5] [--fresh 3]
        [--pulls 6] [--rounds 6] [--no-write]

Placement's predicted first-ready time of a wake (placement/core/predict.py) against
the actual, both from the wake's answer, over scenarios of many wakes each: a. restart
with boot history, b. first wake, c. a pull from a real docker-registry before and
after the worker measured its rate, d. starts in flight on one worker. `SETUP` below
says what each is (it is written with the figures to docs/benchmarks.md).
Figures: actual/predicted p10/p50/p90 and the median |actual - predicted| per scenario,
written after the figures of the run before (the section's "Before" block, kept as it
is; from a section without one, its tables), so the section shows both.
Loopback only; every wait bounded; every process started is stopped; temp dirs removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imagecache.core.egress import EgressPolicy
from loadtests.benchlib import REPORT, machine_line, median, percentile, write_section
from tests.support.docker_registry import DockerRegistry, start_docker_registry
from tests.support.placement_helpers import Platform, eventually
from thaw.imagebuild import OCI_MANIFEST, BuildOverrides, build_image

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "tests" / "e2e" / "apps" / "echo"
DELAYS_S = (0.2, 1.0, 2.0)
PADDING_MB = (5, 20, 50)
IN_FLIGHT = 4  # wakes at once on one worker
STAGGER_S = 0.3  # between staggered wakes: more than a heartbeat (0.2 s)
SPIN_CPU_S = 0.5
# The pulled images' boot: with the interpreter's start about placement's default boot
# (predict.py DEFAULT_BOOT_MS, what a new app is predicted by), so that c's error is the
# pull's.
PULL_BOOT_DELAY_S = 0.25
DEADLINE_MS = 30_000
TIME_LIMIT_S = 900  # the whole measurement, images aside
# A boot that needs CPU, as imports and warm-up do: `SPIN_CPU_S` of its own CPU time,
# then the echo app.
SPIN = """import runpy, sys, time
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
sys.argv = ["app.py"]
runpy.run_path("app.py", run_name="__main__")
"""


@dataclass(frozen=True)
class Sample:
    """One wake: what it predicted and when its first machine was ready (ms from its
    receipt); for a pull, its slowest machine's pull as measured and as `bytes / rate`
    said, and that rate (bytes/s)."""

    predicted_ms: float
    ready_ms: float
    pull_ms: float = 0.0
    pull_predicted_ms: float = 0.0
    rate_bytes_per_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.ready_ms / self.predicted_ms


@dataclass
class Scenario:
    name: str
    samples: list[Sample] = field(default_factory=list)


# ---- images -------------------------------------------------------------------------


def echo_image(layout: Path, tag: str, argv: list[str], src: Path = ECHO) -> str:
    build_image(src, f"echo:{tag}", layout=layout,
                overrides=BuildOverrides(entrypoint=["python3", *argv]))
    return f"oci:{layout}:{tag}"


def layout_images(work: Path) -> dict[str, str]:
    """Tag -> oci: reference of the echo app's variants: `boot<delay>` and `spin`."""
    layout = work / "layout"
    images = {f"boot{d:g}": echo_image(layout, f"boot{d:g}".replace(".", "-"),
                                       ["app.py", "--boot-delay", str(d)])
              for d in DELAYS_S}
    spin = work / "spin-app"
    shutil.copytree(ECHO, spin, ignore=shutil.ignore_patterns("__pycache__"))
    (spin / "spin.py").write_text(SPIN)
    images["spin"] = echo_image(layout, "spin", ["spin.py", str(SPIN_CPU_S)], src=spin)
    return images


@dataclass(frozen=True)
class PaddedImage:
    ref: str
    layer_bytes: int  # as its manifest lists them: what a worker without it must pull


def padded_image(work: Path, registry: DockerRegistry, name: str, mb: int) -> PaddedImage:
    """The echo app and `mb` MiB of random bytes (gzip cannot shrink them), pushed."""
    src = work / name
    shutil.copytree(ECHO, src, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "padding.bin").write_bytes(os.urandom(mb * 2**20))
    build_image(src, f"{name}:v1", push=registry.url, overrides=BuildOverrides(
        entrypoint=["python3", "app.py", "--boot-delay", str(PULL_BOOT_DELAY_S)]))
    shutil.rmtree(src)
    request = urllib.request.Request(f"{registry.url}/v2/{name}/manifests/v1",
                                     headers={"Accept": OCI_MANIFEST})
    with urllib.request.urlopen(request, timeout=10) as reply:
        manifest = json.load(reply)
    return PaddedImage(f"{registry.host}/{name}:v1",
                       sum(layer["size"] for layer in manifest["layers"]))


# ---- the platform -------------------------------------------------------------------


async def create(p: Platform, app: str, image: str, **fields: Any) -> None:
    await p.create_app(name=app, image=image, guest={"cpus": 0.01, "memory_mb": 8},
                       idle_timeout_s=3600, **fields)


async def delete(p: Platform, app: str) -> None:
    status, body = await p.call("DELETE", f"/v1/apps/{app}")
    if status >= 300:
        raise RuntimeError(f"delete {app}: {status} {body}")


async def wake(p: Platform, app: str, count: int = 1) -> Sample:
    status, body = await p.call("POST", f"/internal/apps/{app}/wake",
                                {"count": count, "deadline_ms": DEADLINE_MS},
                                timeout_s=DEADLINE_MS / 1000 + 10)
    if status != 200 or not body["predicted_ms"]:
        raise RuntimeError(f"wake of {app}: {status} {body}")
    return Sample(body["predicted_ms"], body["ready_ms"], body["timings"]["pull_ms"])


async def quiet(p: Platform, apps: list[str]) -> bool:
    """The apps' machines are all stopped in the registry, and no worker's heartbeat
    shows a start in flight: the next wake starts cold, alone."""
    for app in apps:
        if any(m.state != "stopped" for m in await p.registry.machines(app)):
            return False
    return all(w.machines_starting == 0 for w in await p.registry.workers())


async def stop_all(p: Platform, apps: list[str]) -> None:
    for app in apps:
        _, machines = await p.call("GET", f"/v1/apps/{app}/machines")
        for m in machines:
            if m["state"] in ("starting", "started"):
                path = f"/v1/apps/{app}/machines/{m['id']}"
                await p.call("POST", path + "/stop")
                await p.call("GET", path + "/wait?state=stopped&timeout_s=20", timeout_s=30)
    await eventually(lambda: quiet(p, apps), 20)


async def worker_rate(p: Platform) -> float:
    """The pull rate (bytes/s) the only worker's last heartbeat carried (0: none yet)."""
    [worker] = await p.registry.workers()
    return worker.pull_bytes_per_s


# ---- scenarios ----------------------------------------------------------------------


async def restarts(p: Platform, images: dict[str, str], n: int) -> list[Scenario]:
    """a. Each boot delay: one first wake (its boot becomes the history), then `n` times
    stop and wake."""
    found = []
    for k, delay in enumerate(DELAYS_S):
        app = f"restart-{k}"
        await create(p, app, images[f"boot{delay:g}"])
        await wake(p, app)
        scenario = Scenario(f"a. restart, {delay:g} s boot, history known")
        for _ in range(n):
            await stop_all(p, [app])
            scenario.samples.append(await wake(p, app))
        await delete(p, app)
        found.append(scenario)
    return found


async def first_wakes(p: Platform, images: dict[str, str], n: int) -> list[Scenario]:
    """b. `n` new apps per boot delay, each woken once (image already on the worker)."""
    found = {d: Scenario(f"b. first wake, {d:g} s boot, no history") for d in DELAYS_S}
    for i in range(n):
        for k, delay in enumerate(DELAYS_S):
            app = f"first-{i}-{k}"
            await create(p, app, images[f"boot{delay:g}"])
            await eventually(lambda: quiet(p, []), 20)
            found[delay].samples.append(await wake(p, app))
            await delete(p, app)
    return list(found.values())


async def pulled_wake(p: Platform, app: str, image: PaddedImage) -> Sample:
    """A new app's first wake that pulls `image`, with the pull as predicted (the image's
    bytes over the rate the worker's heartbeat carries, or placement's default) beside
    the pull measured."""
    await create(p, app, image.ref)
    await eventually(lambda: quiet(p, []), 20)
    rate = await worker_rate(p) or p.placement.config.reference_bandwidth_bytes_per_s
    sample = await wake(p, app)
    await delete(p, app)
    return Sample(sample.predicted_ms, sample.ready_ms, sample.pull_ms,
                  image.layer_bytes / rate * 1000, rate)


async def in_flight(p: Platform, images: dict[str, str], rounds: int) -> list[Scenario]:
    """d. `IN_FLIGHT` apps (history known) woken together, for each boot kind and timing,
    then each alone (what contention is measured against, and whether the history it
    left predicts a start alone); then one wake of `IN_FLIGHT` machines of one app."""
    found = []
    for slug, kind, image in (("sleep", "1 s sleep", images["boot1"]),
                              ("cpu", f"{SPIN_CPU_S:g} s CPU", images["spin"])):
        apps = [f"flight-{slug}-{i}" for i in range(IN_FLIGHT)]
        for app in apps:
            await create(p, app, image)
            await wake(p, app)
        for stagger_s, how in ((0.0, "at once"), (STAGGER_S, f"{STAGGER_S:g} s apart")):
            scenario = Scenario(f"d. {IN_FLIGHT} apps {how}, {kind} boot")
            for _ in range(rounds):
                await stop_all(p, apps)
                scenario.samples += await together(p, apps, stagger_s)
            found.append(scenario)
        alone = Scenario(f"d. the same {IN_FLIGHT} apps one at a time, {kind} boot")
        for _ in range(rounds):
            for app in apps:
                await stop_all(p, apps)
                alone.samples.append(await wake(p, app))
        found.append(alone)
        await stop_all(p, apps)
    found.append(await one_wake_of_many(p, images["boot1"], rounds))
    return found


async def together(p: Platform, apps: list[str], stagger_s: float) -> list[Sample]:
    async def one(i: int, app: str) -> Sample:
        await asyncio.sleep(i * stagger_s)
        return await wake(p, app)

    return list(await asyncio.gather(*(one(i, app) for i, app in enumerate(apps))))


async def one_wake_of_many(p: Platform, image: str, rounds: int) -> Scenario:
    app = "flight-many"
    await create(p, app, image, max_machines=IN_FLIGHT)
    await wake(p, app, IN_FLIGHT)
    scenario = Scenario(f"d. one wake of {IN_FLIGHT} machines, 1 s sleep boot")
    for _ in range(rounds):
        await stop_all(p, [app])
        scenario.samples.append(await wake(p, app, IN_FLIGHT))
    await delete(p, app)
    return scenario


# ---- runs ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def one_worker(work: Path, egress: EgressPolicy) -> AsyncIterator[Platform]:
    """A platform with one worker, its state in a new dir under `work`."""
    async with Platform(Path(tempfile.mkdtemp(prefix="platform-", dir=work)), agents=1,
                        egress=egress) as p:
        yield p


async def pulls(work: Path, egress: EgressPolicy, padded: dict[tuple[str, int, int],
                PaddedImage], fresh: int, rated: int) -> list[Scenario]:
    """c. Per size: `fresh` wakes, each on a new platform (no rate measured yet); then
    `rated` on one platform whose rate a first pull (not counted) measured."""
    found = []
    for mb in PADDING_MB:
        scenario = Scenario(f"c. new machine, {mb} MiB pull, no rate measured yet")
        for i in range(fresh):
            async with one_worker(work, egress) as p:
                scenario.samples.append(await pulled_wake(p, "fresh", padded["fresh", mb, i]))
        found.append(scenario)
    measured = {mb: Scenario(f"c. new machine, {mb} MiB pull, rate measured")
                for mb in PADDING_MB}
    async with one_worker(work, egress) as p:
        await pulled_wake(p, "warmup", padded["warmup", 20, 0])
        for i in range(rated):
            for mb in PADDING_MB:
                measured[mb].samples.append(
                    await pulled_wake(p, f"rated-{mb}-{i}", padded["rated", mb, i]))
    return found + list(measured.values())


def push_padded(work: Path, registry: DockerRegistry, fresh: int,
                rated: int) -> dict[tuple[str, int, int], PaddedImage]:
    """Every padded image the pull scenario needs: one per wake, so each pulls it whole."""
    wanted = [("warmup", 20, 0)]
    wanted += [("fresh", mb, i) for mb in PADDING_MB for i in range(fresh)]
    wanted += [("rated", mb, i) for mb in PADDING_MB for i in range(rated)]
    return {key: padded_image(work, registry, "pad-{}-{}-{}".format(*key), key[1])
            for key in wanted}


async def measure(work: Path, egress: EgressPolicy, images: dict[str, str],
                  padded: dict[tuple[str, int, int], PaddedImage], args: argparse.Namespace,
                  ) -> list[Scenario]:
    async with one_worker(work, egress) as p:
        found = await restarts(p, images, args.restarts)
        found += await first_wakes(p, images, args.firsts)
        found += await in_flight(p, images, args.rounds)
    return found + await pulls(work, egress, padded, args.fresh, args.pulls)


# ---- the report ---------------------------------------------------------------------


def row(scenario: Scenario) -> str:
    ratios = [s.ratio for s in scenario.samples]
    errors = [abs(s.ready_ms - s.predicted_ms) for s in scenario.samples]
    return (f"| {scenario.name} | {len(ratios)} | {percentile(ratios, 10):.2f} | "
            f"{percentile(ratios, 50):.2f} | {percentile(ratios, 90):.2f} | "
            f"{median(errors):.0f} | {median([s.predicted_ms for s in scenario.samples]):.0f} | "
            f"{median([s.ready_ms for s in scenario.samples]):.0f} |")


def pull_row(scenario: Scenario) -> str:
    rate = median([s.rate_bytes_per_s for s in scenario.samples]) / 1e6
    predicted = median([s.pull_predicted_ms for s in scenario.samples])
    measured = median([s.pull_ms for s in scenario.samples])
    return (f"| {scenario.name} | {rate:.0f} | {predicted:.0f} | {measured:.0f} | "
            f"{measured / predicted:.2f} |")


def table(scenarios: list[Scenario]) -> list[str]:
    return ["| scenario | wakes | p10 actual/predicted | p50 | p90 | median abs error ms "
            "| median predicted ms | median actual ms |", "|---|---|---|---|---|---|---|---|",
            *(row(s) for s in sorted(scenarios, key=lambda s: s.name[:2]) if s.samples)]


def pull_table(scenarios: list[Scenario]) -> list[str]:
    return ["| scenario | rate predicted by, MB/s | pull predicted ms (bytes / rate) "
            "| pull measured ms | measured / predicted |", "|---|---|---|---|---|",
            *(pull_row(s) for s in scenarios if s.samples and s.name.startswith("c."))]


SETUP = """\
Placement predicts, once it knows the workers of a wake's machines, when the first will
be ready (`placement/core/predict.py`, docs/placement.md "Predicted start"): the image
bytes the worker lacks over its measured pull rate (100 MB/s before it measured any),
plus the app's boot history (an EWMA; 300 ms before any), stretched by the starts in
flight on the worker. Every wake's answer carries that prediction and when its first
machine was actually ready, both from the wake's receipt; this benchmark collects them.
The platform runs in one process as the integration tests run it (MemoryRegistry, one
in-process agent with a 0.2 s heartbeat where the default is 1 s, real machine
processes, no sandbox, placement on loopback); each wake is the signed
`POST /internal/apps/{app}/wake` an edge makes, one at a time unless told.

- a. restart: a stopped machine started again, its app's boot history known: the echo
  test app with `--boot-delay` 0.2, 1 and 2 s, woken once, then stopped and woken.
- b. first wake: a new app each wake (no boot history), same three boot delays; its image
  is on the worker already.
- c. pull: a new app whose image, pushed to a real docker-registry, is the echo app (a
  0.25 s boot delay, so that its boot is about the 300 ms default and the error is the
  pull's) plus 5, 20 or 50 MiB of random padding, one image per wake so each pulls it
  whole: on a fresh worker (no rate measured yet), then on one whose rate a first pull
  measured.
- d. in flight: four apps (boot history known) on one worker (2 CPUs) woken at once, or
  0.3 s apart, then each alone, with a 1 s sleeping boot or a boot that burns 0.5 s of
  CPU; and one wake of four machines of one app.

actual/predicted is `ready_ms / predicted_ms`: 1 is exact; above 1 the machine was
later than predicted (the edge holds requests that then time out, as without a
prediction); below 1 it was earlier (the edge refuses at once requests that would have
been served). The second table isolates c's pull: the image's bytes over the rate the
worker's heartbeat carried just before the wake, against the pull the wake measured.
Where a scenario has few wakes, its p10 and p90 are its extremes. "Before" is the run
of the model before the last change to it, kept as it was; "After" is this run of the
model as it is, by the same command (rows a run did not have are missing from it)."""

BEFORE_MODEL = """\
The model then: the pull rate an EWMA of single blob downloads (size over download
time); each start in flight on the worker by its last heartbeat, and each other machine
of the same wake there, stretching the boot by half of itself whatever the worker's
cores; the boot history holding spans as measured, contended or not."""

AFTER_MODEL = """\
The model now: the pull rate an EWMA of whole pulls (the bytes a pull downloaded over its
time from resolve to unpacked); the boot stretched by max(1, (1 + s) / cpus) for s
starts in flight on the worker, the larger of its heartbeat's count and this
placement's own, a start not stretched by those decided after it (so the first of a
wake's machines on a worker is predicted as if alone); the boot history holding each
span divided by the stretch predicted for it."""

FINDINGS = """\
Reading (the model is `placement/core/predict.py`; both runs on the same VM, the second
under more load from other work):

- a. With boot history and no pull, within a few percent, as before.
- b. A first wake is still predicted by the 300 ms default boot, by design: an app that
  boots in 1 or 2 s comes about 3.6 or 6.9 times later than predicted, and its first
  cold start gets no admission control (the edge holds its requests as without a
  prediction). A higher default would refuse requests of fast apps on a guess; the
  first boot is learnt and the next wakes use it.
- c. Pulls: the rate is now whole pulls' (a pull's bytes over its time from resolve to
  unpacked). Once measured, bytes / rate is 0.93-1.02 of the measured pull for 20 and
  50 MiB (second table; before, 2.1-2.2), and those wakes' p50 within 6 % (before,
  1.29-1.53). Still off: one rate spreads a pull's fixed cost (resolve, config, a few
  tens of ms) over its bytes, so in a mix of sizes small pulls are predicted short
  (5 MiB: the pull took 1.43 times its prediction) and large ones a little long. Before
  any rate is measured the 100 MB/s reference is used, unchanged: the 5 MiB pull on a
  fresh worker, mostly fixed cost, came 1.4 times late in this run.
- d. Starts in flight: this placement's own starts now count, so wakes at once see
  each other, and no boot is stretched while the starts fit the worker's two cores.
  Staggered sleeping boots went from p50 0.61 to 0.96, CPU-bound boots at once from
  1.38 to 1.05 (p90 2.67 to 1.53), and one wake of four machines from 0.38 to 1.29: its
  first machine is predicted as if alone.
- Still off, d: the model cannot tell a boot that sleeps from one that burns CPU (here,
  four sleeping boots at once took 1.09 times one alone, four CPU-bound ones 2.8 times,
  more than the cores' share of 2: the platform runs on the same two cores). Past the
  cores it assumes CPU-bound, so: sleeping boots are predicted late where it counts
  contention (at once, p10 0.70: the third and fourth of four, stretched 1.5 and 2
  times); the history, each span divided by the stretch predicted for it, learns a
  sleeping app's boot too short after such wakes (the one wake of four machines, its
  third and fourth divided by 1.5 and 2, predicts its first at about 0.78 of its boot:
  p50 1.29; the sleeping apps alone afterwards, p90 1.48); and the first starts of a
  burst of CPU-bound boots are divided by 1 though the later ones slowed them, so the
  history learnt at once is too long and the staggered wakes that follow come early
  (p50 0.72) until it decays (alone afterwards, 0.98). A per-app measure of how much
  its boot contends, learnt from spans at different counts, would address all three;
  not done."""


SECTION = "bench-predict"
BEFORE, AFTER = "### Before", "### After"


def before_block(doc: str) -> list[str]:
    """The section's "Before" block as it stands; from a section without one (written
    before there were two), its run's figures under `BEFORE_MODEL`; none without it."""
    start, end = f"<!-- {SECTION} -->", f"<!-- /{SECTION} -->"
    if start not in doc or end not in doc:
        return []
    lines = doc.split(start, 1)[1].split(end, 1)[0].splitlines()
    if BEFORE in lines and AFTER in lines:
        block = lines[lines.index(BEFORE) + 1:lines.index(AFTER)]
        return [BEFORE, "", "\n".join(block).strip(), ""]
    figures: list[str] = []
    for previous, line in zip(["", *lines], lines, strict=False):
        if line.startswith("|") and not previous.startswith("|") and figures:
            figures.append("")  # a new table
        if line.startswith(("Command:", "Machine:", "1-minute load", "|")):
            figures.append(line)
    return [BEFORE, "", BEFORE_MODEL, "", *figures, ""] if figures else []


def report(args: argparse.Namespace, scenarios: list[Scenario], took_s: float,
           load: float, before: list[str]) -> str:
    command = (f".venv/bin/python loadtests/bench_predict.py --restarts {args.restarts} "
               f"--firsts {args.firsts} --fresh {args.fresh} --pulls {args.pulls} "
               f"--rounds {args.rounds}")
    return "\n".join([
        "## Wake prediction error (`loadtests/bench_predict.py`)", "", SETUP, "", *before,
        AFTER, "", AFTER_MODEL, "",
        f"Command: `{command}`  ", f"Machine: {machine_line()}  ",
        f"1-minute load average before the run: {load:.2f}, after: {os.getloadavg()[0]:.2f}; "
        f"the run took {took_s:.0f} s.", "",
        *table(scenarios), "", *pull_table(scenarios), "", FINDINGS,
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restarts", type=int, default=10, help="a: wakes per boot delay")
    parser.add_argument("--firsts", type=int, default=5, help="b: new apps per boot delay")
    parser.add_argument("--fresh", type=int, default=3, help="c: fresh workers per size")
    parser.add_argument("--pulls", type=int, default=6, help="c: measured pulls per size")
    parser.add_argument("--rounds", type=int, default=6, help="d: rounds per variant")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-predict-"))
    began = time.monotonic()
    try:
        with start_docker_registry() as registry:
            images = layout_images(work)
            padded = push_padded(work, registry, args.fresh, args.pulls)
            egress = EgressPolicy.build([registry.host], layout_dirs=[str(work.resolve())])
            scenarios = asyncio.run(asyncio.wait_for(
                measure(work, egress, images, padded, args), TIME_LIMIT_S))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    took_s = time.monotonic() - began
    before = before_block(REPORT.read_text()) if REPORT.exists() else []
    body = report(args, scenarios, took_s, load, before)
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
