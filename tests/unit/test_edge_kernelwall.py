"""The edge's wall in the kernel as text (edge/core/kernelwall.py): what it drops, for
whom, and the commands that bar one address."""

from __future__ import annotations

import ipaddress

import pytest

from edge.config import EdgeConfig
from edge.core import kernelwall
from tests.support.credentials import RING

TRUSTED = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))


def test_the_ruleset_drops_barred_clients_and_syn_floods_to_the_edges_ports_only() -> None:
    text = kernelwall.ruleset("thaw_edge", [8443, 8080, 8080], 500, 256, TRUSTED)
    lines = [line.strip() for line in text.splitlines()]
    chain = lines[lines.index("chain input {") + 1:]
    # what is not the edge's is let through before anything is dropped
    assert chain[1:3] == ["meta l4proto != tcp accept", "tcp dport != { 8080, 8443 } accept"]
    assert chain.index("ip saddr @trusted4 accept") < chain.index("ip saddr @barred4 drop")
    assert chain.index("ip6 saddr @trusted6 accept") < chain.index("ip6 saddr @barred6 drop")
    assert "limit rate over 1000/second burst 512 packets" in text  # twice the edge's own
    assert "elements = { 10.0.0.0/8 }" in text and "elements = { fd00::/8 }" in text
    assert text.startswith("table inet thaw_edge {}\ndelete table inet thaw_edge\n")  # afresh
    assert "ct " not in text  # no connection tracking on the warm path


def test_a_bar_is_an_element_with_the_bars_length_in_its_family() -> None:
    four = kernelwall.bar("t", "127.0.0.3", 2.5)
    assert four.splitlines()[-1] == "add element inet t barred4 { 127.0.0.3 timeout 2500ms }"
    mapped = kernelwall.bar("t", "::ffff:192.0.2.7", 60)  # an IPv4 client of a v6 socket
    assert "barred4 { 192.0.2.7 timeout 60000ms }" in mapped
    six = kernelwall.bar("t", "2001:db8::1%eth0", 0.1)
    assert six.splitlines()[-1] == "add element inet t barred6 { 2001:db8::1 timeout 100ms }"
    with pytest.raises(kernelwall.NotAnAddress):
        kernelwall.bar("t", "/run/edge.sock", 1)


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "x" * 33, "t;flush ruleset"])
def test_a_table_name_that_nft_could_misread_is_refused_naming_the_field(name: str) -> None:
    with pytest.raises(ValueError, match="nft_table"):
        kernelwall.check_table(name)
    if name:  # "" is the wall off
        with pytest.raises(ValueError, match="nft_table"):
            EdgeConfig(placement_url="http://p", cluster_keys=RING, nft_table=name)
