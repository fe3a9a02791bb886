"""Leases, wake claims and worker failures in Redis: what several placements on one Redis
agree through.

Each operation is one Lua script (atomic, and correct when redis-py retries it after
a reconnect). Times are Redis's own clock (`TIME`), so placements on hosts whose
clocks differ agree on expiry. Redis errors become `Unavailable` (503) here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ground.registry import keys
from ground.registry.lua import REPORT_DEMAND, UNEXPIRED
from ground.registry.redis import connect
from ground.tasks import cancel_and_wait
from placement.core.claims import Claims
from placement.errors import Unavailable
from placement.ports.failures import MAX_REPORTS, SharedMark
from placement.ports.leases import Taken, Watchers

log = logging.getLogger("thaw.placement")

# KEYS: lease, token clock. ARGV: holder, ttl ms. -> {1, token} or {0, remaining ms}
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current then
  local holder, token = string.match(current, '^(.*)|(%d+)$')
  if holder ~= ARGV[1] then return {0, redis.call('PTTL', KEYS[1])} end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if token <= last then token = last + 1 end
redis.call('SET', KEYS[2], string.format('%d', token))
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. string.format('%d', token), 'PX', ARGV[2])
return {1, string.format('%d', token)}
"""

# KEYS: leases. ARGV: holder, ttl ms, tokens... -> 1/0 per lease
_RENEW = """
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] .. '|' .. ARGV[i + 2] then
    redis.call('PEXPIRE', key, ARGV[2])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
"""

# KEYS: lease. ARGV: holder|token, the release channel, the lease's name.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
"""

# KEYS: the app's claims. ARGV: placement id, JSON claims or '' to withdraw, ttl ms.
_PUBLISH = UNEXPIRED + """
if ARGV[2] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) return 1 end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d ', now_ms + tonumber(ARGV[3])) .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], 60000)
return 1
"""

# KEYS: the app's claims. ARGV: placement id. -> the others' unexpired JSON claims
_OTHERS = UNEXPIRED + """
local found = {}
for _, entry in ipairs(unexpired(KEYS[1])) do
  if entry[1] ~= ARGV[1] then table.insert(found, entry[2]) end
end
return found
"""

# KEYS: the app's demand. ARGV: edge id, demand, ttl ms. The edge's entry lapses in ttl
# if it is still that demand (one written since is newer)
_LAPSE = UNEXPIRED + """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  local until_ms, demand = string.match(current, '^(%d+) (.*)$')
  if demand == ARGV[2] and tonumber(until_ms) > now_ms then  -- (an expired one is none)
    local ttl = tonumber(ARGV[3])
    redis.call('HSET', KEYS[1], ARGV[1], string.format('%d ', now_ms + ttl) .. ARGV[2])
    if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
  end
end
return 1
"""

# KEYS: the worker's reports. ARGV: JSON [reporter, machine], window ms, most kept.
# -> the pairs reported within the window
_SUSPECT = UNEXPIRED + """
local kept = 0
for _, entry in ipairs(unexpired(KEYS[1])) do
  if entry[1] ~= ARGV[1] then kept = kept + 1 end
end
if kept < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d ', now_ms + tonumber(ARGV[2])))
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('HKEYS', KEYS[1])
"""

# KEYS: the marks. ARGV: worker, epoch, ttl ms, reason. A standing mark of the same or a
# newer epoch stays.
_MARK = UNEXPIRED + """
for _, entry in ipairs(unexpired(KEYS[1])) do
  local epoch = tonumber(string.match(entry[2], '^(%d+) '))
  if entry[1] == ARGV[1] and epoch ~= nil and epoch >= tonumber(ARGV[2]) then return 0 end
end
local mark = string.format('%d %d ', now_ms + tonumber(ARGV[3]), tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], ARGV[1], mark .. ARGV[4])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
"""

# KEYS: the marks. -> worker, ms left, epoch, reason for each standing mark (flat)
_MARKS = UNEXPIRED + """
local found = {}
for _, entry in ipairs(unexpired(KEYS[1])) do
  local epoch, reason = string.match(entry[2], '^(%d+) (.*)$')
  if epoch ~= nil then
    table.insert(found, entry[1])
    table.insert(found, entry[3] - now_ms)
    table.insert(found, epoch)
    table.insert(found, reason)
  end
end
return found
"""


class _Wire(msgspec.Struct, frozen=True):
    placing: int
    starting: list[str]


class RedisCoordination:
    """The lease store, the claim book and the failure book of placement, on one
    connection pool."""

    def __init__(self, url: str, *, timeout_s: float = 1.0) -> None:
        self._url = url
        self._r = connect(url, timeout_s=timeout_s)
        self._watchers = Watchers()
        self._listener: asyncio.Task[None] | None = None  # releases heard (see watch)
        self._acquire = self._r.register_script(_ACQUIRE)
        self._renew = self._r.register_script(_RENEW)
        self._release = self._r.register_script(_RELEASE)
        self._publish = self._r.register_script(_PUBLISH)
        self._others = self._r.register_script(_OTHERS)
        self._report = self._r.register_script(REPORT_DEMAND)
        self._lapse = self._r.register_script(_LAPSE)
        self._suspect = self._r.register_script(_SUSPECT)
        self._mark = self._r.register_script(_MARK)
        self._marks = self._r.register_script(_MARKS)

    async def _call(self, awaitable):  # type: ignore[no-untyped-def]
        try:
            return await awaitable
        except (RedisError, OSError) as exc:
            raise Unavailable(f"redis: {exc}", code="registry_unavailable") from exc

    # -- leases --------------------------------------------------------------------------

    async def acquire(self, name: str, holder: str, ttl_s: float) -> int | Taken:
        got, value = await self._call(self._acquire(
            keys=[keys.lease(name), keys.lease_tokens()],
            args=[holder, max(1, int(ttl_s * 1000))]))
        return int(value) if int(got) else Taken(max(0, int(value)) / 1000)

    async def renew(self, leases: list[tuple[str, int]], holder: str,
                    ttl_s: float) -> list[bool]:
        if not leases:
            return []
        answer = await self._call(self._renew(
            keys=[keys.lease(name) for name, _ in leases],
            args=[holder, max(1, int(ttl_s * 1000)), *(token for _, token in leases)]))
        return [bool(int(x)) for x in answer]

    async def release(self, name: str, holder: str, token: int) -> None:
        await self._call(self._release(keys=[keys.lease(name)], args=[
            f"{holder}|{token}", keys.lease_released(), name]))

    def watch(self, name: str) -> asyncio.Event:
        """Set when a release of `name` is heard on the release channel: one subscriber
        connection per process, opened at the first watch (a release before it is
        subscribed is not heard: callers wait with a bound)."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        return self._watchers.watch(name)

    def unwatch(self, name: str, event: asyncio.Event) -> None:
        self._watchers.unwatch(name, event)

    async def _listen(self) -> None:
        """Hear every lease release and set its watchers' events; after an error, again
        a second later (meanwhile waiters wait out their bound)."""
        while True:
            subscriber = aioredis.Redis.from_url(self._url, decode_responses=True)
            try:
                async with subscriber.pubsub() as pubsub:
                    await pubsub.subscribe(keys.lease_released())
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                           timeout=None)
                        if message is not None:
                            self._watchers.released(_text(message["data"]))
            except (RedisError, OSError) as exc:
                log.debug("lease releases not heard for now: %s", exc)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await subscriber.aclose()
            await asyncio.sleep(1.0)

    async def held(self, names: list[str]) -> list[bool]:
        if not names:
            return []
        values = await self._call(self._r.mget([keys.lease(name) for name in names]))
        return [value is not None for value in values]

    # -- wake claims ---------------------------------------------------------------------

    async def others(self, app: str, me: str) -> Claims:
        found = await self._call(self._others(keys=[keys.wake_claims(app)], args=[me]))
        total = Claims()
        for raw in found:
            wire = msgspec.json.decode(raw, type=_Wire)
            total = total.plus(Claims(wire.placing, frozenset(wire.starting)))
        return total

    async def publish(self, app: str, me: str, claims: Claims, ttl_s: float) -> None:
        payload = "" if claims == Claims() else msgspec.json.encode(
            _Wire(claims.placing, sorted(claims.starting))).decode()
        await self._call(self._publish(keys=[keys.wake_claims(app)],
                                       args=[me, payload, max(1, int(ttl_s * 1000))]))

    async def report(self, app: str, edge: str, demand: int, ttl_s: float) -> int:
        return int(await self._call(self._report(
            keys=[keys.wake_demand(app)], args=[edge, max(0, demand), max(1, int(ttl_s * 1000))])))

    async def lapse(self, app: str, edge: str, demand: int, ttl_s: float) -> None:
        await self._call(self._lapse(keys=[keys.wake_demand(app)],
                                     args=[edge, demand, max(1, int(ttl_s * 1000))]))

    # -- worker failures -----------------------------------------------------------------

    async def suspect(self, worker: str, epoch: int, reporter: str, machine: str,
                      window_s: float) -> list[tuple[str, str]]:
        pair = msgspec.json.encode([reporter, machine]).decode()
        found = await self._call(self._suspect(
            keys=[keys.worker_reports(worker, epoch)],
            args=[pair, max(1, int(window_s * 1000)), MAX_REPORTS]))
        heard = (msgspec.json.decode(raw, type=tuple[str, str]) for raw in found)
        return [(reporter, machine) for reporter, machine in heard]

    async def mark_failed(self, worker: str, epoch: int, reason: str, ttl_s: float) -> None:
        await self._call(self._mark(keys=[keys.worker_failures()],
                                    args=[worker, epoch, max(1, int(ttl_s * 1000)), reason]))

    async def failed_workers(self) -> list[SharedMark]:
        flat = await self._call(self._marks(keys=[keys.worker_failures()]))
        return [SharedMark(_text(flat[i]), int(flat[i + 2]), int(flat[i + 1]) / 1000,
                           _text(flat[i + 3]))
                for i in range(0, len(flat), 4)]

    async def close(self) -> None:
        await cancel_and_wait(self._listener)
        await self._r.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_coordination(registry_url: str) -> RedisCoordination | None:
    """The Redis the registry is on, for leases and wake claims; None for the in-memory
    registry (one process: `thaw up`), where memory serves."""
    if registry_url.startswith(("redis://", "rediss://", "unix://")):
        return RedisCoordination(registry_url)
    return None
