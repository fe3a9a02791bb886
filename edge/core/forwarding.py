"""Who the client is, and what a machine is told about it (pure: no IO).

A peer within `--trusted-proxies` (a load balancer or proxy in front of the edge) is
believed about the client: its `X-Forwarded-For` chain is kept with the peer appended,
and the client is the right-most address of the chain that is not itself a trusted
proxy (nginx's `real_ip_recursive on`), and its `X-Forwarded-Proto`/`-Host` (the right-most
item: what the nearest proxy said) are passed on when they are a scheme (http, https)
and a host[:port]; otherwise the edge's own are. Any other peer is the client, and nothing it
says about itself reaches a machine: `X-Forwarded-For`, `X-Real-IP`, `Forwarded` and
`X-Forwarded-Proto`/`-Host` are dropped by the head reader (framing.SET_BY_EDGE) and the
edge writes its own; `Proxy-Authorization` (a credential for a proxy, never the app's)
is dropped from every request. With no trusted proxy (the default) every peer is a
client, as nginx and Envoy (`use_remote_address`) have it at the edge of a network.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from edge.core.framing import host_name

MAX_CHAIN = 32  # addresses of a trusted chain looked at, from the right
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (or bare addresses) as networks; ValueError naming the one that is not."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(f"trusted proxy {cidr!r} is not an address or CIDR") from None
    return tuple(networks)


def address_of(item: bytes) -> Address | None:
    """The address an `X-Forwarded-For` item names: bare, `[v6]`, `[v6]:port` or
    `v4:port` (as some proxies write it); IPv4-mapped IPv6 as IPv4; None if none."""
    text = item.strip()
    if text.startswith(b"["):
        end = text.find(b"]")
        text = text[1:end] if end >= 0 else b""
    elif text.count(b":") == 1:
        text = text.split(b":", 1)[0]
    try:
        found = ipaddress.ip_address(text.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


class TrustedProxies:
    def __init__(self, networks: tuple[Network, ...] = ()) -> None:
        self.networks = networks

    def trusts(self, peer: bytes) -> bool:
        """Whether the peer (an address as the socket gives it) is a trusted proxy."""
        if not self.networks:
            return False
        found = address_of(peer)
        return found is not None and self._within(found)

    def _within(self, found: Address) -> bool:
        return any(found in network for network in self.networks)

    def client(self, chain: bytes | None, peer: bytes, trusted: bool) -> bytes:
        """The client's address: `peer`, unless the peer is trusted and says whom it
        speaks for: then the right-most address of `chain` (its X-Forwarded-For) that is
        not a trusted proxy; if an item is not an address, the nearest one believed."""
        if not trusted or not chain:
            return peer
        nearest = peer
        for item in reversed(chain.split(b",")[-MAX_CHAIN:]):
            found = address_of(item)
            if found is None:
                return nearest
            if not self._within(found):
                return str(found).encode()
            nearest = str(found).encode()
        return nearest


def forwarded_for(chain: bytes | None, peer: bytes, trusted: bool) -> bytes:
    """The `X-Forwarded-For` a machine gets: a trusted peer's chain with the peer
    appended; from any other peer, the peer alone."""
    return chain + b", " + peer if trusted and chain else peer


SCHEMES = frozenset({b"http", b"https"})
MAX_FORWARDED_HOST = 255


def forwarded_scheme_host(proto: bytes | None, host: bytes | None, scheme: bytes,
                          authority: bytes) -> tuple[bytes, bytes]:
    """The X-Forwarded-Proto and -Host a machine is told of a trusted proxy's request: the
    proxy's own when they are a scheme and a host[:port], else the edge's (`scheme`,
    `authority`)."""
    if proto is not None and proto.lower() in SCHEMES:
        scheme = proto.lower()
    if host is not None and len(host) <= MAX_FORWARDED_HOST and host_name(host) is not None:
        authority = host
    return scheme, authority
