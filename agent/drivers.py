"""Which driver runs this agent's machines (agent.driverport), chosen once at start."""

from __future__ import annotations

import logging
import os
import shutil

from agent.config import AgentConfig
from agent.core.machinenet import Egress
from agent.driverport import Driver
from agent.oci import egress
from agent.ocidriver import OciDriver
from agent.sandboxdriver import ProcessMachines

log = logging.getLogger("thaw.agent")

NOT_A_BOUNDARY = ("machines are NOT a security boundary between tenants under the {name} "
                  "driver: they share the host's network and have no cgroup limits "
                  "(run the agent as root with an OCI runtime for containers)")


def make_driver(config: AgentConfig) -> Driver:
    """The configured driver; RuntimeError if it cannot run here."""
    if config.driver in ("auto", "oci"):
        missing = oci_missing(config.runtime)
        if not missing:
            return _oci_driver(config)
        if config.driver == "oci":
            raise RuntimeError(f"the OCI driver cannot run here: {missing}")
        log.info("not the OCI driver: %s", missing)
    sandbox = {"auto": None, "bubblewrap": True, "process": False}[config.driver]
    driver = ProcessMachines(sandbox=sandbox, host=config.machine_host)
    log.warning(NOT_A_BOUNDARY.format(name=driver.name))
    return driver


def oci_missing(runtime: str) -> str:
    """Why the OCI driver cannot run here ("" if it can)."""
    if os.geteuid() != 0:
        return "it needs root (user namespaces, mounts, network namespaces)"
    if shutil.which(runtime) is None:
        return f"the OCI runtime {runtime!r} is not installed (apt-get install runc)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    return egress.missing()


async def sweep(config: AgentConfig) -> None:
    """Remove everything the machines of this state dir have on the host — containers,
    mounts, network namespaces, claims — with no agent running on it (after a kill -9 of
    one whose state is to go). A no-op where the OCI driver cannot run."""
    if oci_missing(config.runtime) or not (config.state_dir / "runtime").exists():
        return
    await _oci_driver(config).sweep(config.state_dir / "machines")


def _oci_driver(config: AgentConfig) -> OciDriver:
    return OciDriver(config.state_dir, runtime=config.runtime,
                     machine_cidr=config.machine_cidr, run_dir=config.run_dir,
                     pids_max=config.machine_pids_max,
                     machine_egress=Egress(config.machine_egress))
