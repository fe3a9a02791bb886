"""Routed host names: one normal form, so that one name cannot be claimed twice.

`normalize_host` lowers case, drops one trailing dot and turns an internationalised
name into its ASCII (IDNA 2008, UTS #46) form — what clients send in `Host` — and
refuses what cannot route an app: wildcards, IP literals, ports, empty labels,
characters outside letters, digits and '-', names over 253 characters. Pure.
"""

from __future__ import annotations

import ipaddress

import idna

MAX_HOST_CHARS = 253


class BadHost(ValueError):
    pass


def normalize_host(name: str) -> str:
    text = name.strip()
    if text.endswith("."):
        text = text[:-1]
    if not text:
        raise BadHost("empty host name")
    if "*" in text:
        raise BadHost(f"{name!r}: wildcard host names are not supported")
    if ":" in text or text.startswith("["):
        raise BadHost(f"{name!r}: a host name has no port and is not an IPv6 literal")
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        pass
    else:
        raise BadHost(f"{name!r}: an IP address cannot route an app")
    try:
        ascii_name = idna.encode(text, uts46=True, std3_rules=True).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise BadHost(f"{name!r}: not a valid host name ({exc})") from None
    if len(ascii_name) > MAX_HOST_CHARS:
        raise BadHost(f"{name!r}: longer than {MAX_HOST_CHARS} characters")
    if ascii_name.rsplit(".", 1)[-1].isdigit():
        raise BadHost(f"{name!r}: the last label of a host name must not be all digits")
    return ascii_name


def within_domain(host: str, domain: str) -> bool:
    """`host` is the platform's domain or a name under it (both normalised)."""
    return host == domain or host.endswith("." + domain)
