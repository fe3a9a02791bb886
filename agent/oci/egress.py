"""The machines' egress policy on this host, carried out with the distribution's `nft`
(the ruleset and what it decides: agent.core.machinenet).

`install` makes the host's table once (every agent of the host calls it at start; a
host-wide lock keeps two from making it twice) and turns IPv4 forwarding on, as Docker
does: machines reach public addresses, and edges on other hosts reach machines, through
the host. `admit`/`forget` put one machine's address in or out of the public set; they
run beside the `ip` batches of its link, so they cost a machine's create little.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from pathlib import Path

from agent.core.machinenet import FAMILY, TABLE, Egress, admit, forget, ruleset
from ground import spawn
from ground.statefiles import file_lock

log = logging.getLogger("thaw.agent")
NFT = "nft"
CALL_TIMEOUT_S = 30.0  # one `nft -f`
FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")


class EgressError(OSError):
    pass


def missing() -> str:
    """Why the policy cannot be applied here ("" if it can)."""
    if shutil.which(NFT) is None:
        return "`nft` (nftables) is not installed (apt-get install nftables)"
    return ""


async def install(run_dir: Path) -> None:
    """Make the host's machine table if it is not there, and forward IPv4."""
    await asyncio.to_thread(_install, run_dir)


def _install(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(run_dir / "nftables.lock"):
        listed = subprocess.run([NFT, "list", "table", FAMILY, TABLE], capture_output=True)
        if listed.returncode != 0:
            made = subprocess.run([NFT, "-f", "-"], input=ruleset().encode(),
                                  capture_output=True)
            if made.returncode != 0:
                raise EgressError(f"nft: {made.stderr.decode(errors='replace')[:500]}")
            log.info("nftables: made table %s %s (the machines' egress policy)", FAMILY,
                     TABLE)
    if FORWARDING.read_text().strip() != "1":
        FORWARDING.write_text("1\n")
        log.info("net.ipv4.ip_forward set to 1 (machines' egress and routed machine subnets)")


async def allow(address: str, egress: Egress) -> None:
    await _nft_script(admit(address, egress))


async def drop(address: str) -> None:
    """Take `address` out of the public set; a missing table (a host rebooted, a sweep
    after it) is not an error."""
    await _nft_script(forget(address), quiet_missing=True)


async def _nft_script(script: str, quiet_missing: bool = False) -> None:
    try:
        done = await spawn.run([NFT, "-f", "-"], input=script.encode(), keep_out=False,
                               timeout_s=CALL_TIMEOUT_S)
    except TimeoutError as exc:
        raise EgressError(str(exc)) from None  # (it names the command)
    if done.returncode != 0:
        text = done.err.decode(errors="replace").strip()
        if quiet_missing and "No such file or directory" in text:
            return
        raise EgressError(f"nft: {text[:500]}")
