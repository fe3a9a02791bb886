"""Egress policy: which registries, network addresses and layout directories a pull may reach.

Decides, from values only, whether an image's registry host is allowed by the
list rule, whether an address a host resolved to may be connected to, whether a
URL's scheme and literal host may be requested, and whether a resolved layout
directory may be read. Invariants: an address that is not public (loopback,
private, link-local, shared, reserved, documentation, multicast, unspecified,
or an IPv6 form embedding such an IPv4 address) is refused unless its host
(or host:port) is listed; a text that is not a canonical address is never
judged public; refusal reasons name only what the owner wrote, never a
resolved address. It must not know about sockets, DNS or HTTP clients.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from imagecache.core.reference import is_loopback_host

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_NUMERIC = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SCHEMES = frozenset({"http", "https"})


def parse_address(text: str) -> IPAddress | None:
    """The IP address `text` spells canonically (brackets allowed for IPv6), else None.

    Legacy numeric forms (`2130706433`, `127.1`, `0x7f.1`, leading zeros) are
    not addresses here, although the C resolver maps them onto one.
    """
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped, 6to4 or NAT64 (64:ff9b::/96) address stands for."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return _is_public(embedded)
        if address.is_site_local:
            return False
    return address.is_global and not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def is_public_address(address: str) -> bool:
    """True when `address` is a canonical IP address that is globally reachable."""
    parsed = parse_address(address)
    return parsed is not None and _is_public(parsed)


def split_host(text: str) -> tuple[str, int | None]:
    """Normalise `host[:port]` (IPv6 in brackets, or bare) to (host, port).

    The host comes back lower case, without a trailing dot, IPv6 compressed and
    in brackets; raise ValueError when it is neither an address nor a DNS name,
    or when it looks numeric without being a canonical address.
    """
    text = text.strip().lower()
    host, port_text = text, ""
    if text.startswith("["):
        close = text.find("]")
        host, rest = text[: close + 1], text[close + 1 :]
        if close < 0 or (rest and not rest.startswith(":")):
            raise ValueError(f"bad host {text!r}")
        port_text = rest[1:] if rest else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    port = _port(text, port_text) if port_text or text.endswith(":") else None
    return _canonical_host(text, host), port


def _port(text: str, port_text: str) -> int:
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port in {text!r}")
    return int(port_text)


def _canonical_host(text: str, host: str) -> str:
    address = parse_address(host)
    if address is not None:
        return f"[{address.compressed}]" if address.version == 6 else address.compressed
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if not name or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"bad host {text!r}")
    if _NUMERIC.match(labels[-1]):
        raise ValueError(f"{text!r} is numeric but not a canonical IP address")
    return name


def _canonical_dir(text: str) -> str:
    path = PurePosixPath(text)
    if not path.is_absolute() or ".." in path.parts:
        raise ValueError(f"layout dir {text!r} must be absolute, without '..'")
    return str(path)


@dataclass(frozen=True)
class EgressPolicy:
    """Where pulls may go. Build it with `EgressPolicy.build`, which normalises entries.

    `registries`: "host" (any port) or "host:port" entries, lower case, IPv6 in
    brackets; a listed host may be reached even at a non-public address.
    `listed_only`: True allows only listed registries; False allows listed ones
    and any registry at a public address. `layout_dirs`: absolute directories
    under which `oci:` layouts may be read (none: layouts are refused).
    """

    registries: frozenset[str] = frozenset()
    listed_only: bool = False
    layout_dirs: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
        registries: Iterable[str] = (),
        *,
        listed_only: bool = False,
        layout_dirs: Iterable[str] = (),
    ) -> EgressPolicy:
        """Normalise entries; raise ValueError naming the first bad one."""
        entries: set[str] = set()
        for entry in registries:
            host, port = split_host(entry)
            entries.add(host if port is None else f"{host}:{port}")
        dirs = tuple(dict.fromkeys(_canonical_dir(d) for d in layout_dirs))
        return cls(registries=frozenset(entries), listed_only=listed_only, layout_dirs=dirs)

    def _listed(self, host: str, port: int | None) -> bool:
        return host in self.registries or (port is not None and f"{host}:{port}" in self.registries)

    def registry_refusal(self, host: str) -> str | None:
        """None when the list rule allows registry `host` (as in a reference), else why not.

        An unlisted IP literal must be public; an unlisted name passes here and
        is judged by the addresses it resolves to (`address_refusal`).
        """
        try:
            name, port = split_host(host)
        except ValueError:
            return f"{host} is not a valid registry host"
        default_port = 80 if is_loopback_host(host) else 443
        if self._listed(name, port if port is not None else default_port):
            return None
        if self.listed_only:
            return f"{host} is not one of the allowed registries"
        address = parse_address(name)
        if address is not None and not _is_public(address):
            return f"{host} is not a public address and is not an allowed registry"
        return None

    def address_refusal(self, host: str, port: int, address: str) -> str | None:
        """After DNS: None when `address` is public or `host` / `host:port` is listed, else why."""
        try:
            name, _ = split_host(f"[{host}]" if ":" in host and not host.startswith("[") else host)
        except ValueError:
            return f"{host} is not a valid host"
        if self._listed(name, port):
            return None
        if is_public_address(address):
            return None
        if parse_address(name) is not None:
            return f"{host} is not a public address and is not an allowed registry"
        return f"{host} resolves to a non-public address and is not an allowed registry"

    def layout_refusal(self, real_path: str) -> str | None:
        """None when the resolved layout directory `real_path` is under one of `layout_dirs`."""
        if not self.layout_dirs:
            return "image layouts are not allowed here" + ALLOW_HINT
        path = PurePosixPath(real_path)
        if path.is_absolute() and ".." not in path.parts:
            for allowed in map(PurePosixPath, self.layout_dirs):
                if path == allowed or allowed in path.parents:
                    return None
        return "the layout is not under an allowed layout directory" + ALLOW_HINT


# what a refused layout's owner is told to ask for (no directory of the host is named)
ALLOW_HINT = ("; an operator allows a directory with --allow-layout DIR (thaw up, or thaw "
              "placement and thaw agent)")


def target_refusal(policy: EgressPolicy, scheme: str, host: str, port: int) -> str | None:
    """Before a request to scheme://host:port: None when it may go ahead, else why not.

    HTTP(S) only. A literal address is judged here, because the HTTP client
    connects to literals without asking a resolver; a name is left to the
    checked resolver, except a numeric-looking one, which is refused outright.
    """
    if scheme.lower() not in _SCHEMES:
        return "only http and https URLs are followed"
    if not host:
        return "a URL without a host"
    bare = host[1:-1] if host.startswith("[") else host
    if parse_address(bare) is not None:
        return policy.address_refusal(bare, port, bare)
    try:
        split_host(bare)
    except ValueError:
        return "a URL whose host is not a valid name or canonical address"
    return None
