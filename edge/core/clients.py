"""What one client may take of the edge, across its connections (pure: no IO, no clock).

A client is a peer address (`--trusted-proxies` are exempt: their connections carry
many clients). Per client, as nginx's `limit_conn` and HAProxy's stick tables keep it:

- open connections, at most `max_conns` (idle keep-alive connections from one source
  cannot take the edge's file descriptors and memory from everyone else);
- new connections per second, a token bucket (`conns_per_s`, bursts of `conns_burst`:
  a client's burst of connections is spread over time, so the work for them does not
  arrive all at once before everyone else's requests);
- HTTP/2 stream resets per second over all its connections (`resets_per_s`, bursts of
  twice that): each connection has its own budget too (edge/core/h2budget.py), and this
  one outlives it, so reconnecting does not renew it (rapid reset, CVE-2023-44487, and
  MadeYouReset, CVE-2025-8671, with reconnects);
- requests begun per turn of the event loop, at most `per_turn` over all its connections
  (a turn is what the loop does between two looks at its sockets): a client's burst —
  hundreds of connections that each send a request at once, twenty HTTP/2 connections
  of a hundred streams — is taken `per_turn` a turn, so the requests of everyone else
  that arrived in the same turn wait for `per_turn` of its requests, not for all of
  them (what Envoy's `max_requests_per_io_cycle` does per connection, here per client);
  the rest wait, unread, for the next turn;
- strikes: a connection the edge cut for abuse (a budget spent: GOAWAY
  ENHANCE_YOUR_CALM) bars its client from new connections for a while, 1 s doubling
  with each strike up to `MAX_BAR_S`, forgiven after `FORGET_S` without one.

A client over any of the others is refused at once (HTTP/1: 429 and close; HTTP/2: GOAWAY
and close); the others see no change. The table is bounded (`max_clients`): a client
with no open connection and no bar is forgotten to make room, least recently seen first.
A client that holds something (an open connection, a bar) is never forgotten — its counts
would start again from nothing — so when the `SCAN` least recently seen all hold
something, a new client is refused (`FULL`), as nginx's `limit_conn` refuses when its
zone is full; the look for room costs at most `SCAN` entries, not the whole table.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from edge.core.bucket import TokenBucket

MAX_BAR_S = 60.0
PER_TURN = 8  # requests a client may begin per turn of the loop
FORGET_S = 300.0  # a client's strikes are forgiven this long after its last one



BARRED = "barred after its connections were cut for abuse"  # (refused without an answer)
FULL = "the edge tracks as many clients as it may, each holding a connection or a bar"
SCAN = 64  # entries looked at for one to forget, least recently seen first

class ClientState:
    __slots__ = ("barred_until", "conns", "open", "resets", "strikes", "struck_at", "taken",
                 "turn")

    def __init__(self, conns_per_s: float, conns_burst: float | None, resets_per_s: float,
                 now: float) -> None:
        self.open = 0
        self.conns = TokenBucket(conns_per_s, now, conns_burst)
        self.resets = TokenBucket(resets_per_s, now)
        self.strikes = 0
        self.struck_at = 0.0
        self.barred_until = 0.0
        self.turn = -1  # the loop turn `taken` counts in
        self.taken = 0


class ClientTable:
    def __init__(self, max_conns: int, conns_per_s: float, resets_per_s: float,
                 max_clients: int = 65536, conns_burst: float | None = None,
                 per_turn: int = PER_TURN) -> None:
        if max_conns < 1 or conns_per_s <= 0 or resets_per_s <= 0 or max_clients < 1 \
                or (conns_burst is not None and conns_burst < 1) or per_turn < 1:
            raise ValueError("client limits must be > 0")
        self.per_turn = per_turn
        # why a connection is refused (made once: a flood of refusals builds no strings)
        self._over_conns = f"more than {max_conns} open connections"
        self._over_new = f"more than {conns_per_s:g} new connections per second"
        self.deferred = 0  # requests left for a later turn, since the start
        self.max_conns = max_conns
        self.conns_per_s = conns_per_s
        self.conns_burst = conns_burst
        self.resets_per_s = resets_per_s
        self.max_clients = max_clients
        self._clients: OrderedDict[bytes, ClientState] = OrderedDict()
        # connections refused, by what the client was over; connections cut for abuse
        self.refused = {"barred": 0, "clients": 0, "connections": 0, "new_connections": 0}
        self.struck = 0

    def __len__(self) -> int:
        return len(self._clients)

    def _get(self, client: bytes, now: float) -> ClientState | None:
        """The client's entry, made if new; None if it is new and there is no room."""
        entry = self._clients.get(client)
        if entry is None:
            if len(self._clients) >= self.max_clients and not self._forget_one(now):
                return None
            entry = self._clients[client] = ClientState(self.conns_per_s, self.conns_burst,
                                                    self.resets_per_s, now)
        else:
            self._clients.move_to_end(client)
        return entry

    def _forget_one(self, now: float) -> bool:
        """Forget the least recently seen client holding nothing (no connection, no bar)
        among the `SCAN` least recently seen; False if each of them holds something."""
        for key, entry in itertools.islice(self._clients.items(), SCAN):
            if entry.open == 0 and entry.barred_until <= now:
                del self._clients[key]
                return True
        return False

    def arrive(self, client: bytes, now: float) -> str | None:
        """A new connection from `client` before anything is spent on it (the TLS door,
        before its handshake): None if it may go on, else why not. It spends a new
        connection; `open(new=False)` counts it once it serves."""
        entry = self._get(client, now)
        if entry is None:
            self.refused["clients"] += 1
            return FULL
        return self._admits(entry, now, True)

    def open(self, client: bytes, now: float, new: bool = True) -> str | None:
        """A connection from `client`: None if it may stay (counted as open), else why
        not. `new=False`: one already counted as new (by `arrive`, or an HTTP/1
        connection that turned out to speak HTTP/2)."""
        entry = self._get(client, now)
        if entry is None:
            self.refused["clients"] += 1
            return FULL
        refused = self._admits(entry, now, new)
        if refused is None:
            entry.open += 1
        return refused

    def _admits(self, entry: ClientState, now: float, new: bool) -> str | None:
        if entry.barred_until > now:
            self.refused["barred"] += 1
            return BARRED
        if entry.open >= self.max_conns:
            self.refused["connections"] += 1
            return self._over_conns
        if new and not entry.conns.take(now):
            self.refused["new_connections"] += 1
            return self._over_new
        return None

    def state(self, client: bytes) -> ClientState | None:
        """What the table keeps of `client` (a connection holds it for its turn shares:
        no lookup per request)."""
        return self._clients.get(client)

    def turn_left(self, entry: ClientState, turn: int) -> int:
        """How many more requests the client may begin in loop turn `turn` (numbered by
        the caller, one more each turn)."""
        if entry.turn != turn:
            return self.per_turn
        return self.per_turn - entry.taken

    def take_turn(self, entry: ClientState, turn: int, count: int = 1) -> bool:
        """`count` requests of the client begin in turn `turn`: False, and none counted,
        if that is more than it has left this turn (they wait for a later one)."""
        if entry.turn != turn:
            entry.turn = turn
            entry.taken = 0
        if entry.taken + count > self.per_turn:
            self.deferred += 1
            return False
        entry.taken += count
        return True

    def close(self, client: bytes) -> None:
        entry = self._clients.get(client)
        if entry is not None and entry.open > 0:
            entry.open -= 1

    def reset(self, client: bytes, now: float) -> bool:
        """One stream reset (the client's RST_STREAM, or a stream error it caused): False
        when that spends the client's budget (its connection is then cut, a strike)."""
        entry = self._get(client, now)  # (a client with a connection always has one)
        return entry is None or entry.resets.take(now)

    def strike(self, client: bytes, now: float) -> float:
        """A connection of `client` was cut for abuse: bar it from new connections; how
        long (seconds)."""
        entry = self._get(client, now)
        self.struck += 1
        if entry is None:  # (a client with a connection always has one)
            return 0.0
        if now - entry.struck_at > FORGET_S:
            entry.strikes = 0
        entry.strikes += 1
        entry.struck_at = now
        bar = min(MAX_BAR_S, 2.0 ** (entry.strikes - 1))
        entry.barred_until = max(entry.barred_until, now + bar)
        return bar

    def open_connections(self, client: bytes) -> int:
        entry = self._clients.get(client)
        return entry.open if entry is not None else 0
