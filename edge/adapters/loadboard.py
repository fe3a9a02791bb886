"""The edges' load board in Redis: a Lua script a round (and one per 256 apps with
demand), by Redis's clock.

`thaw:machine-load` holds each edge's own requests in flight per machine (edge id ->
"expiry_ms JSON"); each edge's demand of an app goes where placement reads the edges'
demand when it sizes a wake (`thaw:wake-demand:APP`, edge id -> "expiry_ms demand").
An edge that begins to load a machine it did not load in its last share adds an entry
to `thaw:machine-load-news` in the same script (a stream of at most ~`NEWS_KEPT`
entries); a resting edge waits on it with one blocked `XREAD` (`news`) on a connection
of its own. Stream ids carry Redis's clock, so one added after a restart of Redis is
still newer than the last an edge saw before it. `report` (the edge's own thaw, before
it answers a wake: docs/edge.md) writes one app's demand and reads every edge's, with
placement's script for the same.
Redis errors are raised as they come: the caller counts its own load meanwhile.
"""

from __future__ import annotations

import logging

import msgspec

from edge.loadshare import NEWS_BLOCK_S, Loads, summed
from ground.registry import keys
from ground.registry.lua import REPORT_DEMAND, UNEXPIRED
from ground.registry.redis import connect

log = logging.getLogger("thaw.edge")

NEWS_KEPT = 100  # entries of the news stream kept (about: trimmed by whole nodes)

# KEYS: the loads, the news. ARGV: edge id, ttl ms, JSON loads ('' when none), '1' to
# add news. News is added too when loads come and the edge's entry is gone or lapsed
# (Redis flushed or restarted, or the edge stalled past its TTL): the others last read
# none of its loads, whatever it last shared. -> the other edges' JSON loads
_SHARE = UNEXPIRED + """
local lapsed = true
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local until_ms = string.match(old, '^(%d+) ')
  lapsed = until_ms == nil or tonumber(until_ms) <= now_ms
end
if ARGV[3] ~= '' and (ARGV[4] == '1' or lapsed) then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', NEWS_KEPT, '*', 'edge', ARGV[1])
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d ', now_ms + tonumber(ARGV[2])) .. ARGV[3])
  redis.call('PEXPIRE', KEYS[1], 60000)
end
local found = {}
for _, entry in ipairs(unexpired(KEYS[1])) do
  if entry[1] ~= ARGV[1] then table.insert(found, entry[2]) end
end
return found
""".replace("NEWS_KEPT", str(NEWS_KEPT))

# KEYS: each app's demand. ARGV: edge id, ttl ms, then each app's demand (0: withdraw).
_DEMAND = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
  local demand = tonumber(ARGV[i + 2])
  if demand > 0 then
    redis.call('HSET', KEYS[i], ARGV[1], string.format('%d %d', now_ms + ttl, demand))
    if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
  else
    redis.call('HDEL', KEYS[i], ARGV[1])
  end
end
return 1
"""

DEMAND_BATCH = 256  # apps' demand per script call: no call holds Redis long

_LOADS = msgspec.json.Decoder(Loads)
_ENCODE = msgspec.json.Encoder()


class RedisLoadBoard:
    def __init__(self, url: str, *, timeout_s: float = 1.0) -> None:
        self._r = connect(url, timeout_s=timeout_s)
        self._news = connect(url, timeout_s=timeout_s,  # no connection until used
                             socket_timeout_s=NEWS_BLOCK_S + timeout_s)
        self._share = self._r.register_script(_SHARE)
        self._demand = self._r.register_script(_DEMAND)
        self._report = self._r.register_script(REPORT_DEMAND)

    async def share(self, edge: str, loads: Loads, demand: dict[str, int],
                    ttl_s: float, news: bool = False) -> Loads:
        ttl_ms = max(1, int(ttl_s * 1000))
        apps = sorted(demand)
        for at in range(0, len(apps), DEMAND_BATCH):
            batch = apps[at:at + DEMAND_BATCH]
            await self._demand(keys=[keys.wake_demand(app) for app in batch],
                               args=[edge, ttl_ms, *(max(0, demand[app]) for app in batch)])
        found = await self._share(
            keys=[keys.machine_load(), keys.machine_load_news()],
            args=[edge, ttl_ms, _ENCODE.encode(loads).decode() if loads else "",
                  "1" if news else ""])
        others = []
        for raw in found:
            try:
                others.append(_LOADS.decode(raw))
            except msgspec.DecodeError as exc:  # (another version's entry): not counted
                log.debug("an edge's load entry not understood: %s", exc)
        return summed(others)

    async def report(self, edge: str, app: str, demand: int, ttl_s: float) -> int:
        return int(await self._report(keys=[keys.wake_demand(app)],
                                      args=[edge, max(0, demand), max(1, int(ttl_s * 1000))]))

    async def news(self, after: str, block_s: float) -> str:
        """The newest news's position once there is any after `after` (within `block_s`;
        `after` itself if none); `after` "": the position now, at once."""
        stream = keys.machine_load_news()
        if not after:
            newest = await self._r.xrevrange(stream, count=1)
            return str(newest[0][0]) if newest else "0-0"
        block_ms = max(1, min(int(block_s * 1000), int(NEWS_BLOCK_S * 1000)))
        reply = await self._news.xread({stream: after}, block=block_ms, count=NEWS_KEPT)
        streams = reply.values() if isinstance(reply, dict) else (e for _, e in reply or ())
        for entries in streams:
            if entries:
                return str(entries[-1][0])
        return after

    async def close(self) -> None:
        await self._r.aclose()
        await self._news.aclose()


def open_load_board(registry_url: str) -> RedisLoadBoard | None:
    """The Redis the registry is on; None for the in-memory registry (one edge)."""
    if registry_url.startswith(("redis://", "rediss://", "unix://")):
        return RedisLoadBoard(registry_url)
    return None
