"""The edge's wall in the kernel (opt-in, nftables): what the edge refuses of a client,
dropped before a socket exists (pure: the ruleset and its commands as text).

The edge's own limits (edge/core/clients.py) refuse a client after the kernel has done
the work of its connection: the TCP handshake, the accept, a socket, the close. A client
reconnecting thousands of times a second costs the edge that much CPU for each refusal,
though its own code is a small part of it. With `--nft-table NAME` (CAP_NET_ADMIN; what
fail2ban and Cloudflare's edge do, as a table of the edge's own) the kernel drops:

- every packet to the edge's ports from a **barred** client (a connection cut for abuse,
  edge/core/clients.py `strike`): the edge adds the address to a set with the bar's
  length as its timeout, and the kernel forgets it when the bar ends;
- **SYNs past a client's rate**: new connections per source beyond `SYN_FACTOR` times the
  edge's own `--new-conns-per-s` (bursts `SYN_FACTOR` times `--new-conns-burst`). The
  edge refuses past its own limit first, with an answer; the kernel only thins a flood
  far past it. A dropped SYN is sent again by the client's kernel after a second.

Trusted proxies are never dropped (they carry many clients). Nothing here needs
connection tracking: the rate is counted on SYNs, so the warm path's packets pass one
set lookup and no state. The table belongs to one edge (its ports are in its rules):
made when the edge starts, deleted when it stops.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

from edge.core.forwarding import Network

FAMILY = "inet"
SYN_FACTOR = 2  # the kernel drops SYNs only past this many times the edge's own rate
MAX_ELEMENTS = 65536  # per set: the kernel's memory for a flood of sources is bounded
RATE_MEMORY_S = 60  # a source's SYN meter is forgotten this long after its last SYN
TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


class NotAnAddress(ValueError):
    pass


def check_table(name: str) -> str:
    """`name` if it may name the edge's table (letters, digits, _; 32 at most)."""
    if not TABLE_NAME.fullmatch(name):
        raise ValueError("nft_table must be a letter then letters, digits or _ (32 at most)")
    return name


def ruleset(table: str, ports: Sequence[int], conns_per_s: float, conns_burst: int,
            trusted: Iterable[Network] = ()) -> str:
    """The whole table, as `nft -f -` takes it: made afresh (an old table of the same name,
    left by an edge that was killed, is replaced)."""
    check_table(table)
    if not ports:
        raise ValueError("the wall needs the edge's ports")
    rate = max(1, round(conns_per_s * SYN_FACTOR))
    burst = max(1, conns_burst * SYN_FACTOR)
    dports = ", ".join(str(p) for p in sorted(set(ports)))
    trusted4 = [str(n) for n in trusted if n.version == 4]
    trusted6 = [str(n) for n in trusted if n.version == 6]
    lines = [
        f"table {FAMILY} {table} {{}}",
        f"delete table {FAMILY} {table}",
        f"table {FAMILY} {table} {{",
        _set("barred4", "ipv4_addr", "timeout"),
        _set("barred6", "ipv6_addr", "timeout"),
        _set("syn4", "ipv4_addr", "dynamic, timeout", f"timeout {RATE_MEMORY_S}s; "),
        _set("syn6", "ipv6_addr", "dynamic, timeout", f"timeout {RATE_MEMORY_S}s; "),
        _set("trusted4", "ipv4_addr", "interval", _elements(trusted4)),
        _set("trusted6", "ipv6_addr", "interval", _elements(trusted6)),
        "  chain input {",
        "    type filter hook input priority -10; policy accept;",
        "    meta l4proto != tcp accept",
        f"    tcp dport != {{ {dports} }} accept",
        "    ip saddr @trusted4 accept",
        "    ip6 saddr @trusted6 accept",
        "    ip saddr @barred4 drop",
        "    ip6 saddr @barred6 drop",
        "    tcp flags & (fin | syn | rst | ack) == syn update @syn4 "
        f"{{ ip saddr limit rate over {rate}/second burst {burst} packets }} drop",
        "    tcp flags & (fin | syn | rst | ack) == syn update @syn6 "
        f"{{ ip6 saddr limit rate over {rate}/second burst {burst} packets }} drop",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _set(name: str, kind: str, flags: str, extra: str = "") -> str:
    return f"  set {name} {{ type {kind}; flags {flags}; size {MAX_ELEMENTS}; {extra}}}"


def _elements(items: list[str]) -> str:
    return f"elements = {{ {', '.join(items)} }}; " if items else ""


def bar(table: str, peer: str, seconds: float) -> str:
    """The command that drops `peer`'s packets to the edge for `seconds` (a longer bar
    of the same address replaces a shorter one: delete, then add)."""
    address = packet_address(peer)
    family = "barred4" if address.version == 4 else "barred6"
    timeout = max(1, round(seconds * 1000))
    return (f"add element {FAMILY} {table} {family} {{ {address} }}\n"
            f"delete element {FAMILY} {table} {family} {{ {address} }}\n"
            f"add element {FAMILY} {table} {family} {{ {address} timeout {timeout}ms }}\n")


def packet_address(peer: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The source address the kernel sees in a client's packets (an IPv4 client of a
    dual-stack socket is `::ffff:a.b.c.d` to the edge, plain IPv4 on the wire)."""
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        raise NotAnAddress(f"not an IP address: {peer[:64]!r}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def delete(table: str) -> str:
    return f"delete table {FAMILY} {check_table(table)}\n"
