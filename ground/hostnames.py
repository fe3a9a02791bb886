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
    # Map first (UTS #46: case, full-width and ideographic dots, …), so that every spelling
    # of one name — trailing dot included, in any script's dot — reaches the same text.
    try:
        text = idna.uts46_remap(name.strip(), std3_rules=False, transitional=False)
    except (idna.IDNAError, UnicodeError) as exc:
        raise BadHost(f"{name!r}: not a valid host name ({exc})") from None
    if text.endswith("."):
        text = text[:-1]  # the root label, once; a second one would be an empty label
    if not text or text.endswith("."):
        raise BadHost(f"{name!r}: empty host name or an empty label")
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
    if len(ascii_name) > MAX_HOST_CHARS or ascii_name.endswith("."):
        raise BadHost(f"{name!r}: longer than {MAX_HOST_CHARS} characters or an empty label")
    if ascii_name.rsplit(".", 1)[-1].isdigit():
        raise BadHost(f"{name!r}: the last label of a host name must not be all digits")
    return ascii_name


def within_domain(host: str, domain: str) -> bool:
    """`host` is the platform's domain or a name under it (both normalised)."""
    return host == domain or host.endswith("." + domain)
