"""WebSocket tunnels by client (pure: no IO, no clock): at most `limit` each.

An app's tunnels are bounded per machine (edge/core/balance.py `tunnel_limit`); this bounds
them per client, over all apps, as nginx's `limit_conn` bounds connections per address:
one client cannot take every tunnel an app's machines may hold from the app's other
clients, nor ask the edge to set up more than `limit` (each an upstream connection and a
101). A tunnel counts from its upgrade request until its exchange ends, held or not.
The client is the peer, or the client a trusted proxy names; a trusted proxy's own
(None) are not counted. Entries exist only while a client has one: the table is as big
as the tunnels are.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class ClientTunnels(Generic[T]):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._count: dict[bytes, int] = {}
        self._owner: dict[T, bytes] = {}

    def take(self, tunnel: T, client: bytes | None) -> bool:
        """Count `tunnel` against `client`; False when the client has `limit` already.
        A tunnel counted before (an upgrade dispatched again) is not counted twice."""
        if client is None or tunnel in self._owner:
            return True
        held = self._count.get(client, 0)
        if held >= self.limit:
            return False
        self._count[client] = held + 1
        self._owner[tunnel] = client
        return True

    def end(self, tunnel: T) -> None:
        """`tunnel` is over (closed, refused, failed): its client may have another."""
        client = self._owner.pop(tunnel, None)
        if client is None:
            return
        left = self._count[client] - 1
        if left:
            self._count[client] = left
        else:
            del self._count[client]

    def of(self, client: bytes) -> int:
        return self._count.get(client, 0)

    def __len__(self) -> int:
        return len(self._owner)
