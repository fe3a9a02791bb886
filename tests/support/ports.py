"""Free loopback ports for servers the tests start."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def _port_range() -> range:
    """Ports the tests' servers are given: below the kernel's ephemeral range (which
    bind(0) and every outgoing connection draw from, so a port picked there may be taken
    by some connection before its server binds it: with test files on two workers, one
    worker's 5,000 connections did), a share of it per pytest-xdist worker."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first, last = 10000, max(low, 12000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    share = (last - first) // count
    return range(first + index * share, first + (index + 1) * share)


_PORTS = _port_range()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free a moment ago, from this worker's share below the
    ephemeral range (random order, each one bound to check), so that services given
    their ports up front (before any binds) never share one."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.choice(_PORTS)
        if port in chosen:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        chosen.append(port)
    return chosen


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago."""
    return free_ports(1, host)[0]


def wait_for_port(host: str, port: int, timeout_s: float = 10.0,
                  alive: Callable[[], bool] = lambda: True) -> None:
    """Block until a TCP connect to host:port succeeds, or raise TimeoutError (at once
    when `alive` says the server that was to listen there has exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if not alive():
                raise TimeoutError(f"the server for {host}:{port} exited") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host}:{port} did not accept within {timeout_s}s") from None
            time.sleep(0.02)


def listening(port: int) -> bool:
    """Whether any socket listens on TCP `port` (whoever holds it)."""
    out = subprocess.run(["ss", "-Hltn", f"( sport = :{port} )"], capture_output=True,
                         text=True, timeout=10).stdout
    return bool(out.strip())


def wait_until_unbound(port: int, timeout_s: float = 10.0) -> None:
    """After a kill -9: block until nothing listens on `port`. A child the killed server
    forked just before (a `runc` or `nft` it was starting) holds a copy of the listening
    socket until it execs — up to ~100 ms on a loaded machine — and a connection made
    meanwhile (a restarted server's port probe, its first call) is queued on that ghost
    and reset when the exec closes it."""
    deadline = time.monotonic() + timeout_s
    while listening(port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"port {port} still listened on {timeout_s}s after the kill")
        time.sleep(0.02)
