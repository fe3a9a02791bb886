"""Hosts as network namespaces on one LAN, for tests of the multi-host layout.

A bridge in a namespace of its own is the LAN (10.214.N.0/24, N random per run); each
named host is a namespace with one veth on it; the test's own (root) namespace joins it
too, at .254, so the test reaches every host's services and the control plane it runs
itself is reachable from them. Everything is made here and removed by `close`, so the
only non-loopback addresses a test touches are these."""

from __future__ import annotations

import os
import random
import subprocess


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True)


class HostNets:
    def __init__(self, hosts: list[str]) -> None:
        self.tag = os.urandom(2).hex()
        self.lan = random.randrange(1, 250)
        self.lan_ns = f"thwlan-{self.tag}"
        self.root_if = f"tlan{self.tag}"
        self.namespaces = {name: f"thwh-{name}-{self.tag}" for name in hosts}
        self.addresses = {name: f"10.214.{self.lan}.{i + 1}" for i, name in enumerate(hosts)}
        self.root_address = f"10.214.{self.lan}.254"
        self._routes: list[tuple[str, ...]] = []

    def __enter__(self) -> HostNets:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        ip("netns", "add", self.lan_ns)
        ip("-n", self.lan_ns, "link", "add", "br0", "type", "bridge")
        ip("-n", self.lan_ns, "link", "set", "br0", "up")
        self._join(None, self.root_if, self.root_address)
        for i, (name, ns) in enumerate(self.namespaces.items()):
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            self._join(ns, f"lan{i}", self.addresses[name])

    def _join(self, ns: str | None, inner: str, address: str) -> None:
        """A veth from `ns` (None: the root namespace) to the LAN's bridge."""
        outer = f"{inner[:6]}-{self.tag}"
        ip("link", "add", outer, "netns", self.lan_ns, "type", "veth", "peer", "name",
           inner, *(["netns", ns] if ns else []))
        ip("-n", self.lan_ns, "link", "set", outer, "master", "br0", "up")
        inside = ["-n", ns] if ns else []
        ip(*inside, "addr", "add", f"{address}/24", "dev", inner)
        ip(*inside, "link", "set", inner, "up")

    def route(self, host: str | None, cidr: str, via: str) -> None:
        """On `host` (None: the test's namespace), `cidr` is reached through host `via`."""
        inside = ["-n", self.namespaces[host]] if host else []
        ip(*inside, "route", "add", cidr, "via", self.addresses[via])
        if host is None:
            self._routes.append((cidr, self.addresses[via]))

    def cut(self, host: str) -> None:
        """The host's LAN link goes down: to the others it is gone."""
        ip("-n", self.namespaces[host], "link", "set",
           f"lan{list(self.namespaces).index(host)}", "down")

    def run_in(self, host: str) -> list[str]:
        """The argv prefix that runs a command on `host`: its network namespace only (not
        `ip netns exec`, whose fresh /sys hides the cgroup mounts a runtime needs)."""
        return ["nsenter", f"--net=/run/netns/{self.namespaces[host]}", "--"]

    def close(self) -> None:
        for cidr, via in self._routes:
            ip("route", "del", cidr, "via", via, check=False)
        ip("link", "del", self.root_if, check=False)
        for ns in self.namespaces.values():
            ip("netns", "del", ns, check=False)
        ip("netns", "del", self.lan_ns, check=False)
