"""The machines' egress ruleset and resolver file (agent.core.machinenet): pure text."""

from __future__ import annotations

import ipaddress

from agent.core.machinenet import (
    BLOCKED_V4,
    FALLBACK_RESOLVERS,
    PUBLIC_SET,
    TABLE,
    Egress,
    admit,
    forget,
    resolv_conf,
    ruleset,
)


def test_the_blocked_ranges_cover_private_link_local_loopback_and_the_metadata_address() -> None:
    blocked = [ipaddress.IPv4Network(block) for block in BLOCKED_V4]
    for address in ("10.213.0.3", "172.17.0.1", "192.168.1.1", "127.0.0.1",
                    "169.254.169.254", "100.64.0.1", "224.0.0.1", "0.0.0.0"):
        assert any(ipaddress.IPv4Address(address) in net for net in blocked), address
    for address in ("1.1.1.1", "8.8.8.8", "11.213.0.2", "93.184.216.34"):
        assert not any(ipaddress.IPv4Address(address) in net for net in blocked), address


def test_the_ruleset_refuses_whatever_a_machine_opens_to_the_host_or_another_machine() -> None:
    text = ruleset()
    assert f"table inet {TABLE}" in text
    input_chain = text.split("chain input")[1].split("}")[0]
    assert 'iifname "th*" ct state established,related accept' in input_chain
    assert 'iifname "th*" counter goto refuse' in input_chain
    forward = text.split("chain forward")[1].split("}")[0]
    lines = [line.strip() for line in forward.splitlines() if "iifname" in line]
    assert lines[0].startswith('iifname "th*" oifname "th*"')  # machine to machine first
    assert lines.index(next(x for x in lines if "@blocked" in x)) < lines.index(
        next(x for x in lines if f"@{PUBLIC_SET} accept" in x))  # private before public
    assert lines[-1] == 'iifname "th*" counter goto refuse'  # anything else


def test_refusals_are_tcp_resets_not_rate_limited_icmp() -> None:
    refuse = ruleset().split("chain refuse")[1].split("}")[0]
    assert "meta l4proto tcp reject with tcp reset" in refuse


def test_a_machine_without_egress_is_taken_out_of_the_public_set_even_if_never_in_it() -> None:
    assert admit("10.213.0.3", Egress.PUBLIC) == (
        f"add element inet {TABLE} {PUBLIC_SET} {{ 10.213.0.3 }}\n")
    closed = admit("10.213.0.3", Egress.NONE).splitlines()
    assert closed == [f"add element inet {TABLE} {PUBLIC_SET} {{ 10.213.0.3 }}",
                      f"delete element inet {TABLE} {PUBLIC_SET} {{ 10.213.0.3 }}"]
    assert forget("10.213.0.3") == admit("10.213.0.3", Egress.NONE)


def test_a_machine_gets_the_hosts_public_resolvers_else_public_fallbacks_else_none() -> None:
    host = "search lan\nnameserver 127.0.0.53\nnameserver 9.9.9.9\nnameserver 10.0.0.2\n"
    assert resolv_conf(host, Egress.PUBLIC) == "nameserver 9.9.9.9\n"
    assert resolv_conf("nameserver 10.255.255.53\n", Egress.PUBLIC) == "".join(
        f"nameserver {server}\n" for server in FALLBACK_RESOLVERS)
    assert resolv_conf("nameserver not-an-address\n", Egress.PUBLIC).count("nameserver") == 2
    assert "nameserver " not in resolv_conf(host, Egress.NONE)
