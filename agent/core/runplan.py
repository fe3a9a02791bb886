"""What a machine runs, from its spec and its image's config: the argv, the port the app
listens on, its environment, working directory, user and stop signal.

argv follows Docker's rules with Kubernetes' overrides (ImageConfig.argv_with). The port
is the spec's, else the image's only ExposedPort, else 8080, and PORT says it. The stop
signal is the app's `kill_signal`, else the image's StopSignal, else SIGTERM. An image
with nothing to run is refused here (and at deploy, by placement). It must not know about
files or processes.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from agent.core.records import MachineSpec
from imagecache.api import ImageConfig

DEFAULT_PORT = 8080
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOTHING_TO_RUN = ("the image has no Entrypoint or Cmd and the app sets neither "
                  "`entrypoint` nor `cmd`")


class NothingToRun(ValueError):
    pass


@dataclass(frozen=True)
class RunPlan:
    argv: list[str]
    port: int
    env: dict[str, str]
    workdir: str
    user: str
    stop_signal: str  # a signal name


def default_port(image: ImageConfig) -> int:
    """The image's one exposed TCP port, else 8080."""
    tcp = [p.split("/")[0] for p in image.exposed_ports if not p.endswith("/udp")]
    if len(tcp) == 1 and tcp[0].isdigit() and 0 < int(tcp[0]) < 65536:
        return int(tcp[0])
    return DEFAULT_PORT


def stop_signal(kill_signal: str, image: ImageConfig) -> str:
    """The signal name a stop sends first."""
    for candidate in (kill_signal, image.stop_signal):
        name = signal_name(candidate)
        if name:
            return name
    return "SIGTERM"


def signal_name(value: str) -> str:
    """"SIGINT", "INT" or "2" as "SIGINT"; "" if it is none of those."""
    value = value.strip().upper()
    if value.isdigit():
        try:
            return signal.Signals(int(value)).name
        except ValueError:
            return ""
    name = value if value.startswith("SIG") else f"SIG{value}"
    return name if name in signal.Signals.__members__ else ""


def run_plan(machine_id: str, spec: MachineSpec, image: ImageConfig,
             secrets: dict[str, str] | None = None) -> RunPlan:
    """The plan; NothingToRun when neither the image nor the spec says what to run.
    `secrets`: the app's, unsealed (their names are never the app's env's nor PORT's)."""
    argv = image.argv_with(spec.entrypoint, spec.cmd)
    if not argv:
        raise NothingToRun(NOTHING_TO_RUN)
    port = spec.port or default_port(image)
    env = dict(kv.split("=", 1) for kv in image.env if "=" in kv)
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(spec.env)
    env.update(secrets or {})
    env.update(PORT=str(port), THAW_APP=spec.app, THAW_MACHINE_ID=machine_id)
    return RunPlan(argv=argv, port=port, env=env, workdir=image.working_dir or "/",
                   user=image.user, stop_signal=stop_signal(spec.kill_signal, image))
