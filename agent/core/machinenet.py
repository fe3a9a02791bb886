"""What a machine may reach: the host's nftables ruleset for machines, as text.

Every machine's link to the host is a veth whose host end is named `th…`
(agent.oci.netns). The ruleset decides, for packets that come in on such a link:
- to the host itself (input): only replies to connections the host opened (the edge's,
  the agent's health checks) pass; anything a machine opens to the host (agent API,
  edge, placement, Redis, PostgreSQL, any port on any of the host's addresses) is
  rejected;
- to another machine of this host: rejected, whatever the app;
- to a private, link-local, loopback, multicast or reserved address (other hosts of the
  cluster, metadata services at 169.254.169.254, the LAN): rejected;
- to a public address: accepted and masqueraded behind the host's address when the
  machine's address is in the `public` set, else rejected (`--machine-egress none`).
Packets from elsewhere *to* a machine (an edge on another host, routed to this host's
machine subnet) are not this ruleset's business: they pass as routing allows.

Rejections answer at once: a TCP reset (a machine's connect fails with "connection
refused" rather than hanging until its own timeout; resets are not rate-limited as the
kernel's ICMP errors are, so a machine trying many addresses gets an answer for each),
ICMP admin-prohibited for anything else.

One table per host, shared by every agent on it (all describe it identically), named
with its version so an agent of another version never edits it by mistake; each agent
adds and removes its own machines' addresses in the `public` set. Must not know: which
app a machine is, processes, `nft` itself.
"""

from __future__ import annotations

import enum
import ipaddress

TABLE = "thaw_machines_v1"
FAMILY = "inet"
PUBLIC_SET = "public"
HOST_IF_PATTERN = "th*"

# Where no machine may go (RFC 6890 special-purpose IPv4, private ranges included).
BLOCKED_V4 = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private (machines, other hosts, the LAN)
    "100.64.0.0/10",  # shared address space (carrier NAT, some clouds' internal ranges)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local: cloud metadata services
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation
    "192.88.99.0/24",  # 6to4 relay
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, broadcast
)


class Egress(enum.Enum):
    """What a machine may open to the outside world."""

    PUBLIC = "public"  # public addresses, through NAT
    NONE = "none"  # nothing: only answers to connections made to it


def ruleset() -> str:
    """The `nft -f` script that makes the table (run once per host, under a lock)."""
    blocked = ", ".join(BLOCKED_V4)
    reject = "goto refuse"
    machine = f'iifname "{HOST_IF_PATTERN}"'
    return f"""table {FAMILY} {TABLE} {{
    set {PUBLIC_SET} {{ type ipv4_addr; }}
    set blocked {{ type ipv4_addr; flags interval; elements = {{ {blocked} }} }}
    chain refuse {{
        meta l4proto tcp reject with tcp reset
        reject with icmpx type admin-prohibited
    }}
    chain input {{
        type filter hook input priority filter - 5; policy accept;
        {machine} ct state established,related accept
        {machine} counter {reject}
    }}
    chain forward {{
        type filter hook forward priority filter - 5; policy accept;
        {machine} oifname "{HOST_IF_PATTERN}" counter {reject}
        {machine} ct state established,related accept
        {machine} ip daddr @blocked counter {reject}
        {machine} meta nfproto ipv6 counter {reject}
        {machine} ip saddr @{PUBLIC_SET} accept
        {machine} counter {reject}
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr @{PUBLIC_SET} oifname != "{HOST_IF_PATTERN}" masquerade
    }}
}}
"""


def admit(address: str, egress: Egress) -> str:
    """The `nft -f` script that gives the machine at `address` its egress. For NONE the
    address is taken out of the public set (an earlier machine may have left it there):
    `delete element` of an absent one fails, so it is added first, in one transaction."""
    element = f"{FAMILY} {TABLE} {PUBLIC_SET} {{ {address} }}"
    if egress is Egress.PUBLIC:
        return f"add element {element}\n"
    return f"add element {element}\ndelete element {element}\n"


def forget(address: str) -> str:
    """The `nft -f` script that takes a gone machine's address out of the public set,
    whether or not it was in it."""
    element = f"{FAMILY} {TABLE} {PUBLIC_SET} {{ {address} }}"
    return f"add element {element}\ndelete element {element}\n"


FALLBACK_RESOLVERS = ("1.1.1.1", "8.8.8.8")


def resolv_conf(host_resolv_conf: str, egress: Egress) -> str:
    """The machine's /etc/resolv.conf: the host's public nameservers (a private or
    loopback one is out of a machine's reach), else public fallbacks, as Docker replaces
    a host's localhost resolvers; with no egress, no nameserver at all."""
    if egress is Egress.NONE:
        return "# this machine has no egress (--machine-egress none): no resolver\n"
    servers = [parts[1] for parts in (line.split() for line in host_resolv_conf.splitlines())
               if len(parts) >= 2 and parts[0] == "nameserver" and _public(parts[1])]
    return "".join(f"nameserver {server}\n" for server in servers or FALLBACK_RESOLVERS)


def _public(address: str) -> bool:
    """`address` is an IPv4 address outside every blocked range."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return not any(ip in ipaddress.IPv4Network(block) for block in BLOCKED_V4)
