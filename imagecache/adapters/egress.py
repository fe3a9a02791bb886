"""The egress policy at the socket: a checked DNS resolver and the HTTP session built on it.

aiohttp asks its resolver for every name it connects to and connects only to
the addresses the resolver returns, so a resolver that drops the addresses the
policy refuses leaves no window between the check and the connect (no DNS
rebinding). aiohttp never asks the resolver about IP literals, and follows
redirects on its own unless told not to: those are the registry client's to
check (`core.egress.target_refusal`, `allow_redirects=False`).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from imagecache.core.budget import POOL_CONNECTIONS, POOL_PER_HOST
from imagecache.core.egress import EgressPolicy

# (host, port) -> the addresses it resolves to, as text ("192.0.2.7", "2001:db8::7")
Lookup = Callable[[str, int], Awaitable[list[str]]]


class EgressRefused(OSError):
    """Every address a name resolved to was refused by the egress policy."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def system_lookup(host: str, port: int) -> list[str]:
    """The loop's getaddrinfo, as a list of address strings in the order given."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
    )
    addresses: list[str] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and str(sockaddr[0]) not in addresses:
            addresses.append(str(sockaddr[0]))
    return addresses


class CheckedResolver(AbstractResolver):
    """Resolves a name and returns only the addresses `policy` allows for it."""

    def __init__(self, policy: EgressPolicy, lookup: Lookup | None = None) -> None:
        self._policy = policy
        self._lookup = lookup or system_lookup

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        allowed: list[ResolveResult] = []
        reason = f"{host} resolves to no address"
        for address in await self._lookup(host, port):
            refusal = self._policy.address_refusal(host, port, address)
            found = socket.AF_INET6 if ":" in address else socket.AF_INET
            if refusal is not None:
                reason = refusal
            elif family in (socket.AF_UNSPEC, found):
                allowed.append(_result(host, address, port, found))
        if not allowed:
            raise EgressRefused(reason)
        return allowed

    async def close(self) -> None:
        return None


def _result(host: str, address: str, port: int, family: int) -> ResolveResult:
    return ResolveResult(
        hostname=host,
        host=address,
        port=port,
        family=family,
        proto=0,
        flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
    )


def checked_session(
    policy: EgressPolicy, *, timeout: aiohttp.ClientTimeout, lookup: Lookup | None = None
) -> aiohttp.ClientSession:
    """A session whose every connection to a name goes to an address `policy` allowed.

    No proxies from the environment (they would connect on our behalf) and no
    cookies. Callers must still pass `allow_redirects=False` and check literal
    hosts themselves.
    """
    # Per registry host, few connections: a registry that stalls (an owner's own, say)
    # holds at most these, never the whole pool that every other pull shares.
    connector = aiohttp.TCPConnector(resolver=CheckedResolver(policy, lookup),
                                     limit=POOL_CONNECTIONS, limit_per_host=POOL_PER_HOST)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def refusal_of(exc: BaseException) -> str | None:
    """The policy's reason when an aiohttp error came from a refused resolution, else None."""
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, EgressRefused):
        return exc.os_error.reason
    return None
