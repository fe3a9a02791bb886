"""The egress policy's decisions: public addresses, the registry list, URL targets, layout dirs."""

from __future__ import annotations

import pytest

from imagecache.core.egress import EgressPolicy, is_public_address, split_host, target_refusal

NOT_PUBLIC = [
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback, not only .1"),
    ("10.0.0.1", "private 10/8"),
    ("172.16.0.1", "private 172.16/12"),
    ("172.31.255.254", "private 172.16/12, top"),
    ("192.168.1.1", "private 192.168/16"),
    ("169.254.169.254", "link-local: cloud metadata"),
    ("169.254.0.1", "link-local"),
    ("0.0.0.0", "unspecified"),
    ("255.255.255.255", "broadcast"),
    ("224.0.0.1", "multicast (is_global says True)"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("100.64.0.1", "shared, carrier-grade NAT"),
    ("192.0.2.1", "documentation TEST-NET-1"),
    ("198.51.100.7", "documentation TEST-NET-2"),
    ("203.0.113.9", "documentation TEST-NET-3"),
    ("198.18.0.1", "benchmarking"),
    ("::1", "IPv6 loopback"),
    ("::", "IPv6 unspecified"),
    ("fe80::1", "IPv6 link-local"),
    ("fe80::1%eth0", "IPv6 link-local with a zone"),
    ("fc00::1", "unique local"),
    ("fd12:3456::1", "unique local"),
    ("fec0::1", "site-local (is_global says True)"),
    ("ff02::1", "IPv6 multicast"),
    ("2001:db8::1", "IPv6 documentation"),
    ("::ffff:127.0.0.1", "IPv4-mapped loopback"),
    ("::ffff:169.254.169.254", "IPv4-mapped metadata"),
    ("::ffff:10.1.2.3", "IPv4-mapped private"),
    ("2002:7f00:1::", "6to4 of 127.0.0.1 (is_global says True)"),
    ("2002:a00:1::1", "6to4 of 10.0.0.1"),
    ("64:ff9b::7f00:1", "NAT64 of 127.0.0.1"),
    ("64:ff9b::a9fe:a9fe", "NAT64 of 169.254.169.254"),
    ("64:ff9b:1::1", "local-use NAT64"),
    ("::7f00:1", "IPv4-compatible, deprecated (is_global says True)"),
    ("2001::1", "Teredo"),
    ("2130706433", "decimal 127.0.0.1 is not an address"),
    ("127.1", "short form is not an address"),
    ("0x7f.0.0.1", "hex form is not an address"),
    ("0177.0.0.1", "octal form is not an address"),
    ("127.000.000.001", "leading zeros are not an address"),
    ("localhost", "a name is not an address"),
    ("", "empty"),
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "::ffff:8.8.8.8",
    "2002:808:808::1",
    "64:ff9b::808:808",
    "[2606:4700:4700::1111]",
]


@pytest.mark.parametrize(("address", "why"), NOT_PUBLIC)
def test_non_public_and_non_canonical_addresses_are_not_public(address: str, why: str) -> None:
    assert not is_public_address(address), why


@pytest.mark.parametrize("address", PUBLIC)
def test_globally_reachable_addresses_and_their_ipv6_wrappings_are_public(address: str) -> None:
    assert is_public_address(address)


def test_build_normalises_case_trailing_dots_and_ipv6_brackets() -> None:
    policy = EgressPolicy.build(
        ["Registry.Example.COM.", "127.0.0.1:5000", "[0:0::1]:7", "::1", "[::FFFF:7F00:1]"]
    )
    assert policy.registries == frozenset(
        {"registry.example.com", "127.0.0.1:5000", "[::1]:7", "[::1]", "[::ffff:7f00:1]"}
    )


@pytest.mark.parametrize(
    "entry",
    [
        "http://a.example/x",
        "a:b:c",
        "host:0",
        "host:70000",
        "1.2.3",
        "2130706433",
        "[::1",
        "a..b",
        "-a.example",
        "",
        "a b",
    ],
)
def test_build_refuses_a_bad_registry_entry_naming_it(entry: str) -> None:
    with pytest.raises(ValueError) as caught:
        EgressPolicy.build([entry])
    assert repr(entry.strip().lower()) in str(caught.value)


@pytest.mark.parametrize("directory", ["relative/dir", "/srv/../etc", ""])
def test_build_refuses_layout_dirs_that_are_relative_or_climb(directory: str) -> None:
    with pytest.raises(ValueError):
        EgressPolicy.build(layout_dirs=[directory])


def test_split_host_keeps_the_port_apart_for_names_and_both_ipv6_forms() -> None:
    assert split_host("Registry.Example:5000") == ("registry.example", 5000)
    assert split_host("[::1]:5000") == ("[::1]", 5000)
    assert split_host("::1") == ("[::1]", None)
    assert split_host("10.0.0.1") == ("10.0.0.1", None)


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:19999",
        "[::1]:19999",
        "10.0.0.1:5000",
        "169.254.169.254",
        "[::ffff:127.0.0.1]:19999",
        "[fe80::1]:80",
        "0.0.0.0:80",
        "[::]:5000",
    ],
)
def test_unlisted_non_public_ip_literal_registries_are_refused(host: str) -> None:
    reason = EgressPolicy().registry_refusal(host)
    assert reason is not None and host in reason


@pytest.mark.parametrize("host", ["2130706433:5000", "127.1:5000", "0x7f.1", "a_b.example"])
def test_registry_hosts_that_are_not_names_or_canonical_addresses_are_refused(host: str) -> None:
    assert EgressPolicy().registry_refusal(host) is not None


def test_unlisted_names_and_public_literals_pass_the_list_rule_when_not_listed_only() -> None:
    policy = EgressPolicy()
    assert policy.registry_refusal("registry.example.com") is None
    assert policy.registry_refusal("registry-1.docker.io") is None
    assert policy.registry_refusal("8.8.8.8:5000") is None


def test_listed_only_refuses_every_registry_not_listed_even_public_ones() -> None:
    policy = EgressPolicy.build(["ghcr.io"], listed_only=True)
    assert policy.registry_refusal("ghcr.io") is None
    assert policy.registry_refusal("GHCR.io:443") is None
    reason = policy.registry_refusal("registry-1.docker.io")
    assert reason == "registry-1.docker.io is not one of the allowed registries"
    assert EgressPolicy.build(listed_only=True).registry_refusal("8.8.8.8") is not None


def test_a_listed_host_with_a_port_allows_only_that_port_and_a_bare_host_any_port() -> None:
    policy = EgressPolicy.build(["127.0.0.1:5000", "10.0.0.9", "registry.internal:443"])
    assert policy.registry_refusal("127.0.0.1:5000") is None
    assert policy.registry_refusal("127.0.0.1:5001") is not None
    assert policy.registry_refusal("10.0.0.9:1234") is None
    assert policy.registry_refusal("10.0.0.9") is None
    assert policy.registry_refusal("registry.internal") is None  # https: port 443
    assert policy.address_refusal("registry.internal", 443, "10.1.1.1") is None
    assert policy.address_refusal("registry.internal", 8443, "10.1.1.1") is not None


def test_address_refusal_allows_public_addresses_and_listed_hosts_only() -> None:
    policy = EgressPolicy.build(["[::1]:7000", "mirror.internal"])
    assert policy.address_refusal("registry.example.com", 443, "93.184.216.34") is None
    assert policy.address_refusal("::1", 7000, "::1") is None
    assert policy.address_refusal("[::1]", 7000, "::1") is None
    assert policy.address_refusal("mirror.internal", 80, "10.0.0.5") is None
    assert policy.address_refusal("::1", 7001, "::1") is not None
    assert policy.address_refusal("registry.example.com", 443, "::ffff:127.0.0.1") is not None
    assert policy.address_refusal("registry.example.com", 443, "2130706433") is not None


def test_a_refused_resolution_names_the_host_and_never_the_address() -> None:
    reason = EgressPolicy().address_refusal("registry.example.test", 443, "10.20.30.40")
    assert reason is not None
    assert "registry.example.test" in reason and "10.20.30.40" not in reason


@pytest.mark.parametrize(
    ("scheme", "host", "port"),
    [
        ("file", "", 0),
        ("ftp", "registry.example.com", 21),
        ("gopher", "x.example", 70),
        ("http", "", 80),
        ("http", "127.0.0.1", 80),
        ("https", "::1", 443),
        ("http", "::ffff:7f00:1", 80),
        ("http", "169.254.169.254", 80),
        ("http", "2130706433", 80),
        ("http", "0x7f.1", 80),
    ],
)
def test_targets_with_other_schemes_or_non_public_literal_hosts_are_refused(
    scheme: str, host: str, port: int
) -> None:
    assert target_refusal(EgressPolicy(), scheme, host, port) is not None


def test_named_or_public_or_listed_targets_are_left_to_the_resolver() -> None:
    policy = EgressPolicy.build(["127.0.0.1:5000"])
    assert target_refusal(policy, "https", "registry.example.com", 443) is None
    assert target_refusal(policy, "HTTPS", "8.8.8.8", 443) is None
    assert target_refusal(policy, "http", "127.0.0.1", 5000) is None
    assert target_refusal(policy, "http", "127.0.0.1", 5001) is not None


def test_layouts_are_refused_when_no_layout_dir_is_allowed() -> None:
    assert EgressPolicy().layout_refusal("/srv/images/app") is not None


def test_a_layout_must_be_at_or_under_an_allowed_dir_by_whole_components() -> None:
    policy = EgressPolicy.build(layout_dirs=["/srv/images/", "/var/lib/thaw/layouts"])
    assert policy.layout_dirs == ("/srv/images", "/var/lib/thaw/layouts")
    assert policy.layout_refusal("/srv/images") is None
    assert policy.layout_refusal("/srv/images/team/app") is None
    assert policy.layout_refusal("/var/lib/thaw/layouts/x") is None
    assert policy.layout_refusal("/srv/images-other/app") is not None
    assert policy.layout_refusal("/srv") is not None
    assert policy.layout_refusal("/etc") is not None
    assert policy.layout_refusal("srv/images/app") is not None
    assert policy.layout_refusal("/srv/images/../../etc") is not None
