"""A machine's network: its container's network namespace, joined to the host by a veth.

The runtime makes the namespace when it creates the container (so it belongs to the
container's user namespace, and the container may mount its own /sys); before the app is
started the agent names it (`ip netns attach thaw-<machine id>`, under /run/netns) and
links it to the host. Each machine gets a /31 of the agent's pool (RFC 3021): the host end
of its veth holds the even address, the machine's `eth0` the odd one, and nothing else
shares the link: no bridge, so no machine can see another's frames or answer ARP for it.
The host reaches the machine through the connected route of the /31; the machine's
default route is the host end of its own link (what may leave through it is the egress
policy's business). The distribution's `ip` does it, in two batches.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from ground import spawn

IP = "ip"
CALL_TIMEOUT_S = 30.0  # one `ip -batch`
NETNS_DIR = Path("/run/netns")
DEFAULT_CIDR = "10.213.0.0/16"


class NetworkError(OSError):
    pass


@dataclass(frozen=True)
class Link:
    """The /31 of one machine: `slot` numbers it within the pool."""

    netns: str  # the namespace's name under /run/netns
    host_if: str  # the host end of the veth
    host_ip: str
    machine_ip: str

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)


class Pool:
    """The agent's machine addresses: a /31 per slot of an IPv4 network."""

    def __init__(self, cidr: str = DEFAULT_CIDR) -> None:
        network = ipaddress.IPv4Network(cidr)
        if network.prefixlen > 30:
            raise ValueError(f"machine cidr {cidr}: too small (at most a /30)")
        self.network = network
        self.slots = network.num_addresses // 2

    def link(self, machine_id: str, slot: int) -> Link:
        if not 1 <= slot < self.slots:
            raise ValueError(f"slot {slot} is not in {self.network}")
        host = self.network.network_address + 2 * slot
        return Link(netns=f"thaw-{machine_id}", host_if=f"th{machine_id[:13]}",
                    host_ip=str(host), machine_ip=str(host + 1))


def exists(link: Link) -> bool:
    return (NETNS_DIR / link.netns).exists() and _has_interface(link.host_if)


def _has_interface(name: str) -> bool:
    """An interface `name` is in this process's network namespace (/proc/sys/net shows
    the reader's namespace; /sys/class/net the one /sys was mounted in, which differs for
    an agent started in a namespace of its own by `nsenter --net`)."""
    return os.path.exists(f"/proc/sys/net/ipv4/conf/{name}")


async def create(link: Link, pid: int) -> None:
    """Name the network namespace of process `pid` (a created container's init) and link
    it to the host; whatever an earlier run left of the link is removed first."""
    await remove(link)
    ns = link.netns
    await _ip_batch([
        f"netns attach {ns} {pid}",
        f"link add {link.host_if} type veth peer name eth0 netns {ns}",
        f"addr add {link.host_ip}/31 dev {link.host_if}",
        f"link set {link.host_if} up",
    ])
    await _ip_batch([
        f"addr add {link.machine_ip}/31 dev eth0",
        "link set lo up",
        "link set eth0 up",
        f"route add default via {link.host_ip}",
    ], netns=ns)


async def remove(link: Link) -> None:
    """Remove the link and the namespace; whatever of them is left (idempotent)."""
    commands = _removals(link)
    if commands:
        await _ip_batch(commands, force=True)


def _removals(link: Link) -> list[str]:
    commands = []
    if _has_interface(link.host_if):
        commands.append(f"link del {link.host_if}")
    if (NETNS_DIR / link.netns).exists():
        commands.append(f"netns del {link.netns}")
    return commands


async def _ip_batch(commands: list[str], force: bool = False, netns: str = "") -> None:
    """One `ip` for the commands (in namespace `netns` if given)."""
    argv = [IP, *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch",
            "-"]
    try:
        done = await spawn.run(argv, input="\n".join(commands).encode() + b"\n",
                               keep_out=False, timeout_s=CALL_TIMEOUT_S)
    except TimeoutError as exc:
        raise NetworkError(str(exc)) from None  # (it names the command)
    if done.returncode != 0:
        raise NetworkError(f"ip: {done.err.decode(errors='replace').strip()[:500]}")
