"""Who the client is behind trusted proxies, and what X-Forwarded-For a machine gets."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.core.forwarding import (
    TrustedProxies,
    address_of,
    forwarded_for,
    forwarded_scheme_host,
    parse_networks,
)

TRUST = TrustedProxies(parse_networks(["10.0.0.0/8", "192.0.2.1", "2001:db8::/32"]))


def test_no_trusted_proxy_trusts_no_one() -> None:
    assert not TrustedProxies().trusts(b"127.0.0.1")
    assert TrustedProxies().client(b"1.2.3.4", b"127.0.0.1", trusted=False) == b"127.0.0.1"


@pytest.mark.parametrize(("peer", "trusted"), [
    (b"10.1.2.3", True), (b"192.0.2.1", True), (b"192.0.2.2", False),
    (b"2001:db8::5", True), (b"::ffff:10.0.0.9", True), (b"11.0.0.1", False),
    (b"unknown", False), (b"", False),
])
def test_a_peer_is_trusted_only_within_the_networks(peer: bytes, trusted: bool) -> None:
    assert TRUST.trusts(peer) is trusted


@pytest.mark.parametrize(("chain", "client"), [
    (b"198.51.100.7", b"198.51.100.7"),
    (b"198.51.100.7, 10.1.1.1", b"198.51.100.7"),  # the proxy's own hop is skipped
    (b"6.6.6.6, 198.51.100.7, 10.1.1.1", b"198.51.100.7"),  # what the client wrote: no
    (b"garbage, 10.1.1.1", b"10.1.1.1"),  # the nearest address believed
    (b"[2001:db9::1]:443", b"2001:db9::1"),
    (b"198.51.100.7:5555", b"198.51.100.7"),
    (b"10.2.2.2, 10.3.3.3", b"10.2.2.2"),  # every hop trusted: the farthest
])
def test_the_client_is_the_right_most_untrusted_address(chain: bytes, client: bytes) -> None:
    assert TRUST.client(chain, b"10.0.0.1", trusted=True) == client


def test_an_untrusted_peer_is_the_client_whatever_it_says() -> None:
    assert TRUST.client(b"10.1.1.1", b"203.0.113.5", trusted=False) == b"203.0.113.5"
    assert forwarded_for(b"10.1.1.1", b"203.0.113.5", trusted=False) == b"203.0.113.5"
    assert forwarded_for(b"1.1.1.1", b"10.0.0.1", trusted=True) == b"1.1.1.1, 10.0.0.1"
    assert forwarded_for(None, b"10.0.0.1", trusted=True) == b"10.0.0.1"


def test_a_bad_cidr_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=re.escape("'10.0.0.0/33'")):
        parse_networks(["10.0.0.0/8", "10.0.0.0/33"])


@given(st.binary(max_size=300))
def test_any_chain_names_an_address_or_the_peer(chain: bytes) -> None:
    found = TRUST.client(chain, b"10.0.0.1", trusted=True)
    assert found == b"10.0.0.1" or address_of(found) is not None


@pytest.mark.parametrize(("proto", "host", "told"), [
    (b"https", b"www.example.com", (b"https", b"www.example.com")),
    (b"HTTP", b"[::1]:8443", (b"http", b"[::1]:8443")),
    (None, None, (b"http", b"web.localhost")),
    (b"ftp", b"user@evil.test", (b"http", b"web.localhost")),
    (b"https ", b"a" * 256, (b"http", b"web.localhost")),  # the reader strips; a raw one
    (b"", b"", (b"http", b"web.localhost")),
    (b"https", b"evil.test:99999", (b"https", b"web.localhost")),
])
def test_a_trusted_proxys_scheme_and_host_are_believed_only_when_they_are_such(
    proto: bytes | None, host: bytes | None, told: tuple[bytes, bytes],
) -> None:
    assert forwarded_scheme_host(proto, host, b"http", b"web.localhost") == told
