"""Free loopback ports for servers the tests start."""

from __future__ import annotations

import socket
from collections.abc import Callable


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports, every socket held until all are chosen: services given
    their ports up front (before any binds) never share one, as separate free_port()
    calls may when a port handed out is not bound yet."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def wait_for_port(host: str, port: int, timeout_s: float = 10.0,
                  alive: Callable[[], bool] = lambda: True) -> None:
    """Block until a TCP connect to host:port succeeds, or raise TimeoutError (at once
    when `alive` says the server that was to listen there has exited)."""
    import time

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
