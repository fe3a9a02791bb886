"""ClientTunnels: WebSocket tunnels by client, at most `limit` each, counted once per
tunnel, given back when it ends (edge/core/tunnels.py)."""

from __future__ import annotations

import random

from edge.core.tunnels import ClientTunnels


def test_a_client_at_its_limit_is_refused_and_others_are_not() -> None:
    tunnels: ClientTunnels[str] = ClientTunnels(2)
    assert tunnels.take("a1", b"10.0.0.1") and tunnels.take("a2", b"10.0.0.1")
    assert not tunnels.take("a3", b"10.0.0.1")  # its third
    assert tunnels.take("b1", b"10.0.0.2")  # another client: untouched
    tunnels.end("a1")
    assert tunnels.take("a3", b"10.0.0.1")  # one ended: room for one more
    assert (tunnels.of(b"10.0.0.1"), tunnels.of(b"10.0.0.2"), len(tunnels)) == (2, 1, 3)


def test_a_tunnel_dispatched_again_counts_once_and_a_trusted_proxys_own_not_at_all() -> None:
    tunnels: ClientTunnels[str] = ClientTunnels(1)
    assert tunnels.take("a", b"c") and tunnels.take("a", b"c")  # again: the same one
    assert tunnels.of(b"c") == 1
    assert all(tunnels.take(f"p{i}", None) for i in range(10)) and len(tunnels) == 1
    tunnels.end("p3")  # never counted: nothing to give back
    tunnels.end("a")
    tunnels.end("a")  # ended twice: given back once
    assert tunnels.of(b"c") == 0 and len(tunnels) == 0


def test_counts_are_exact_and_the_table_empties_whatever_the_order() -> None:
    rng = random.Random(7)
    tunnels: ClientTunnels[int] = ClientTunnels(3)
    open_: dict[int, bytes] = {}
    for n in range(5000):
        if open_ and rng.random() < 0.45:
            tunnel = rng.choice(list(open_))
            tunnels.end(tunnel)
            del open_[tunnel]
        else:
            client = rng.choice([b"a", b"b", b"c"])
            held = sum(c == client for c in open_.values())
            assert tunnels.take(n, client) == (held < 3)
            if held < 3:
                open_[n] = client
        for client in (b"a", b"b", b"c"):
            assert tunnels.of(client) == sum(c == client for c in open_.values())
    for tunnel in list(open_):
        tunnels.end(tunnel)
    assert len(tunnels) == 0 and tunnels._count == {}
