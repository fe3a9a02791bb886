"""Redis registry backend (redis-py asyncio): the view shared by services on many hosts.

Every write is one Lua script that checks its guard (epoch, updated_at,
version), writes a whole record and appends to the change stream atomically,
so a write retried by redis-py after a reconnect changes nothing the second
time. Timeouts are short: the registry is advisory and callers carry on.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, RedisError

from ground.appconfig import AppConfig
from ground.registry import keys
from ground.registry.lua import UNEXPIRED
from ground.registry.types import (
    ROUTES,
    WORKERS,
    Change,
    Feed,
    MachineRecord,
    PlacementAdvert,
    WorkerStatus,
)

FEED_LENGTH = 10_000
FEED_BLOCK_MS = 1000  # a read of the feed waits this long for a change (by default)
# the longest a follower may ask one read to wait (`changes(block_s=…)`): it reads on
# connections of their own, whose socket timeout is longer still
LONG_FEED_BLOCK_MS = 60_000
T = TypeVar("T")
READS_PER_ROUND_TRIP = 200  # apps whose records travel (and are decoded) together
WRITES_PER_ROUND_TRIP = 200  # apps one put_apps script writes (Redis is busy meanwhile)

# A heartbeat; answers the registry's generation (made here if the view was lost), so a
# worker notices a loss on the write it makes anyway (no call of its own to ask).
_PUBLISH_WORKER = """
local generation = redis.call('GET', KEYS[5])
if not generation then
  generation = ARGV[6]
  redis.call('SET', KEYS[5], generation)
end
local seen = tonumber(redis.call('GET', KEYS[2]) or '-1')
if seen > tonumber(ARGV[3]) then return generation end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'worker', 'key', ARGV[1])
return generation
"""

_SET_LAYERS = """
for _, digest in ipairs(redis.call('HKEYS', KEYS[1])) do
  redis.call('HDEL', ARGV[2] .. digest, ARGV[1])
end
redis.call('DEL', KEYS[1])
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('HSET', ARGV[2] .. ARGV[i], ARGV[1], ARGV[i + 1])
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'kind', 'layers', 'key', ARGV[1])
return 1
"""

# Upsert a JSON record in a hash unless the stored one has a higher ARGV[3] in field ARGV[4].
_PUT_GUARDED = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and tonumber(cjson.decode(current)[ARGV[4]]) > tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'kind', ARGV[6], 'key', ARGV[7])
return 1
"""

# _PUT_GUARDED for many apps: ARGV[1] the feed's length, then (name, JSON, version) each.
_PUT_APPS = """
for i = 2, #ARGV, 3 do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  if not current or tonumber(cjson.decode(current)['version']) <= tonumber(ARGV[i + 2]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'kind', 'app', 'key', ARGV[i])
  end
end
return 1
"""

_MARK_REPUBLISHED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', 'kind', 'republished', 'key', ARGV[1])
return 1
"""

_DELETE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'kind', ARGV[3], 'key', ARGV[4])
end
return 1
"""

# The values of hash KEYS[1] (compact JSON: no raw newline) one a line, ARGV[1] lines to
# a string: a few replies to read, and each split and decoded between turns of the loop,
# rather than 10,000 replies parsed in one go.
_VALUES_BY_LINE = """
local values, size, out = redis.call('HVALS', KEYS[1]), tonumber(ARGV[1]), {}
for i = 1, #values, size do
  out[#out + 1] = table.concat(values, '\\n', i, math.min(i + size - 1, #values))
end
return out
"""

# For every hash in KEYS (in order): its number of values on a line, then its values one
# a line, all in one string.
_COUNTED_VALUES_OF_MANY = """
local out = {}
for _, key in ipairs(KEYS) do
  local values = redis.call('HVALS', key)
  out[#out + 1] = tostring(#values)
  for _, value in ipairs(values) do out[#out + 1] = value end
end
return table.concat(out, '\\n')
"""

# KEYS: the adverts. ARGV: placement id, ttl ms, JSON advert. The expired ones are
# dropped; the key outlives its newest entry.
_PUBLISH_PLACEMENT = UNEXPIRED + """
unexpired(KEYS[1])
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d ', now_ms + ttl) .. ARGV[3])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""

# KEYS: the adverts. -> the JSON of those not expired (read only: edges may only read)
_PLACEMENTS = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local found = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local until_ms, rest = string.match(all[i + 1], '^(%d+) (.*)$')
  if until_ms ~= nil and tonumber(until_ms) > now_ms then table.insert(found, rest) end
end
return found
"""

_GENERATION = """
local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""


def _decoded(raw: str, kind: type[T], known: dict[str, T], seen: dict[str, T]) -> T:
    """`raw` (JSON) decoded as `kind`, or what the same text decoded to last time; noted
    in `seen`."""
    value = known.get(raw)
    if value is None:
        value = msgspec.json.decode(raw, type=kind)
    seen[raw] = value
    return value


# Connections one client opens at most; callers beyond wait (up to POOL_WAIT_S) for one
# to come back rather than fail: redis-py's default pool refuses the 101st concurrent
# call ("Too many connections"), which a herd of wakes reaches. A herd of 100 cold wakes
# at 2,000 apps ran a 64-connection pool dry for longer than 2 s ("No connection
# available": issue 25), so: more connections, and a wait within a wake's budget.
POOL_CONNECTIONS = 128
POOL_WAIT_S = 5.0


class PoolWaits:
    """Calls of this process that found every connection of their pool in use and waited
    (for /metrics: placement's thaw_placement_redis_pool_waits)."""

    count = 0
    seconds = 0.0


class WaitingPool(aioredis.BlockingConnectionPool):
    """redis-py's blocking pool, counting the calls that had to wait (PoolWaits), and
    telling `connected` callbacks of every connection it makes or makes again (a
    restarted Redis is reconnected to: its view may be a new, empty one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connected: list[Callable[[], None]] = []

    def make_connection(self) -> Any:
        connection = super().make_connection()
        connection.register_connect_callback(self._connection_made)  # (kept weakly)
        return connection

    def _connection_made(self, connection: Any) -> None:
        for callback in self.connected:
            callback()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self.can_get_connection():
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        began = time.monotonic()
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        finally:
            PoolWaits.count += 1
            PoolWaits.seconds += time.monotonic() - began


class ReadOnlyScript:
    """A script that only reads, run as EVALSHA_RO: a user with read-only access to its
    keys may run it (EVALSHA asks for write access to every key it names)."""

    def __init__(self, client: aioredis.Redis, script: str) -> None:
        self._client = client
        self._script = script
        self._sha = hashlib.sha1(script.encode()).hexdigest()

    async def __call__(self, keys: list[str], args: list[str | int]) -> Any:
        try:
            return await self._client.evalsha_ro(self._sha, len(keys), *keys, *args)
        except NoScriptError:
            self._sha = await self._client.script_load(self._script)
            return await self._client.evalsha_ro(self._sha, len(keys), *keys, *args)


def _stream(feed: Feed) -> str:
    return keys.worker_changes() if feed == WORKERS else keys.changes()


class CancelSafeRedis(aioredis.Redis):
    """redis-py's client, but a cancel its command consumed is raised after all.

    redis-py sends each command under `asyncio.wait_for` (the socket timeout), and on
    Python 3.11 `wait_for` returns the result of an inner call that finished in the
    same turn as a cancel of its caller, consuming that cancel (reimplemented in 3.12):
    the caller goes on, `cancelling` but running, and a stop that waits for it to end
    waits forever. Seen as a hung stop in about one run in 40 of
    tests/integration/test_registry_loss.py (an agent's publisher, placement's feed
    follower, a periodic round), and at will in tests/integration/test_redis_cancel.py.
    A command after which the task has more cancels asked for than before it (none of
    them delivered) raises CancelledError itself."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        result = await super().execute_command(*args, **options)
        if task is not None and task.cancelling() > asked:
            raise asyncio.CancelledError
        return result


def connect(url: str, *, timeout_s: float, socket_timeout_s: float | None = None
            ) -> aioredis.Redis:
    """A client on a bounded pool that makes callers wait for a free connection; each call
    retried twice on a connection error (Lua scripts here are safe to run again)."""
    retry = Retry(ExponentialBackoff(cap=0.1, base=0.01), retries=2)
    pool = WaitingPool.from_url(
        url, max_connections=POOL_CONNECTIONS, timeout=POOL_WAIT_S, decode_responses=True,
        socket_timeout=socket_timeout_s or timeout_s, socket_connect_timeout=timeout_s,
        retry=retry)
    return CancelSafeRedis.from_pool(pool)


class RegistryUnavailable(Exception):
    """Redis could not be reached in time (translated from redis-py's errors)."""


class RedisRegistry:
    def __init__(self, url: str, *, timeout_s: float = 1.0) -> None:
        self._url, self._timeout_s = url, timeout_s
        self._r = connect(url, timeout_s=timeout_s)
        # XREAD BLOCK needs a socket timeout longer than the block.
        self._feed = connect(url, timeout_s=timeout_s,
                             socket_timeout_s=FEED_BLOCK_MS / 1000 + timeout_s)
        self._long_feed = connect(url, timeout_s=timeout_s,  # no connection until used
                                  socket_timeout_s=LONG_FEED_BLOCK_MS / 1000 + timeout_s)
        self._publish_worker = self._r.register_script(_PUBLISH_WORKER)
        self._set_layers = self._r.register_script(_SET_LAYERS)
        self._put_guarded = self._r.register_script(_PUT_GUARDED)
        self._delete = self._r.register_script(_DELETE)
        self._put_apps = self._r.register_script(_PUT_APPS)
        self._mark_republished = self._r.register_script(_MARK_REPUBLISHED)
        self._generation = self._r.register_script(_GENERATION)
        self._publish_placement = self._r.register_script(_PUBLISH_PLACEMENT)
        self._placements = ReadOnlyScript(self._r, _PLACEMENTS)
        self._values_by_line = ReadOnlyScript(self._r, _VALUES_BY_LINE)
        self._counted_values_of_many = ReadOnlyScript(self._r, _COUNTED_VALUES_OF_MANY)
        # What the last apps() and machines_of() decoded, by JSON text: unchanged records
        # (nearly all, in a resync) are neither decoded again (~10 µs a config) nor made
        # anew, so a resync leaves the garbage collector little to do.
        self._configs_by_text: dict[str, AppConfig] = {}
        self._machines_by_text: dict[str, MachineRecord] = {}

    async def _call(self, awaitable):  # type: ignore[no-untyped-def]
        try:
            return await awaitable
        except (RedisError, OSError) as exc:
            raise RegistryUnavailable(str(exc)) from exc

    async def publish_worker(self, status: WorkerStatus, ttl_s: float) -> str:
        return str(await self._call(self._publish_worker(
            keys=[keys.worker(status.id), keys.worker_epoch(status.id), keys.workers(),
                  keys.worker_changes(), keys.generation()],
            args=[status.id, msgspec.json.encode(status), status.epoch,
                  max(1, int(ttl_s * 1000)), FEED_LENGTH, secrets.token_hex(8)],
        )))

    async def workers(self, region: str | None = None) -> list[WorkerStatus]:
        ids = sorted(await self._call(self._r.smembers(keys.workers())))
        if not ids:
            return []
        raw = await self._call(self._r.mget([keys.worker(i) for i in ids]))
        gone = [wid for wid, value in zip(ids, raw, strict=True) if value is None]
        if gone:
            await self._call(self._r.srem(keys.workers(), *gone))
        found = [msgspec.json.decode(v, type=WorkerStatus) for v in raw if v is not None]
        return [w for w in found if region is None or w.region == region]

    async def worker(self, worker_id: str) -> WorkerStatus | None:
        raw = await self._call(self._r.get(keys.worker(worker_id)))
        return None if raw is None else msgspec.json.decode(raw, type=WorkerStatus)

    async def set_worker_layers(self, worker_id: str, layers: dict[str, int]) -> None:
        pairs = [item for digest, size in sorted(layers.items()) for item in (digest, size)]
        await self._call(self._set_layers(
            keys=[keys.worker_layers(worker_id), keys.worker_changes()],
            args=[worker_id, keys.layer_holders(""), FEED_LENGTH, *pairs],
        ))

    async def layer_holders(self, digest: str) -> dict[str, int]:
        raw = await self._call(self._r.hgetall(keys.layer_holders(digest)))
        return {worker: int(size) for worker, size in raw.items()}

    async def put_machine(self, record: MachineRecord) -> None:
        await self._put(keys.machines(record.app), record.id, msgspec.json.encode(record),
                        record.updated_at, "updated_at", "machine", f"{record.app}/{record.id}")

    async def delete_machine(self, app: str, machine_id: str) -> None:
        await self._call(self._delete(
            keys=[keys.machines(app), keys.changes()],
            args=[machine_id, FEED_LENGTH, "machine", f"{app}/{machine_id}"],
        ))

    async def machines(self, app: str) -> list[MachineRecord]:
        raw = await self._call(self._r.hvals(keys.machines(app)))
        return [msgspec.json.decode(v, type=MachineRecord) for v in raw]

    async def machines_of(self, apps: Iterable[str]) -> dict[str, list[MachineRecord]]:
        names = list(apps)
        known, seen = self._machines_by_text, {}
        found: dict[str, list[MachineRecord]] = {}
        for start in range(0, len(names), READS_PER_ROUND_TRIP):
            batch = names[start:start + READS_PER_ROUND_TRIP]
            text = await self._call(self._counted_values_of_many(
                keys=[keys.machines(name) for name in batch], args=[]))
            lines = text.split("\n")
            at = 0
            for name in batch:
                count, at = int(lines[at]), at + 1
                if count:
                    found[name] = [_decoded(raw, MachineRecord, known, seen)
                                   for raw in lines[at:at + count]]
                    at += count
        self._machines_by_text = seen
        return found

    async def put_app(self, config: AppConfig) -> None:
        await self._put(keys.apps(), config.name, msgspec.json.encode(config), config.version,
                        "version", "app", config.name)

    async def put_apps(self, configs: Sequence[AppConfig]) -> None:
        for start in range(0, len(configs), WRITES_PER_ROUND_TRIP):
            args: list[str | bytes | int] = [FEED_LENGTH]
            for config in configs[start:start + WRITES_PER_ROUND_TRIP]:
                args += [config.name, msgspec.json.encode(config), config.version]
            await self._call(self._put_apps(keys=[keys.apps(), keys.changes()], args=args))

    async def app(self, name: str) -> AppConfig | None:
        raw = await self._call(self._r.hget(keys.apps(), name))
        return None if raw is None else msgspec.json.decode(raw, type=AppConfig)

    async def apps(self) -> list[AppConfig]:
        chunks = await self._call(self._values_by_line(keys=[keys.apps()],
                                                       args=[READS_PER_ROUND_TRIP]))
        known, seen = self._configs_by_text, {}
        for chunk in chunks:
            await asyncio.sleep(0)  # a first read of 10,000 decodes for ~0.1 s
            for raw in chunk.split("\n"):
                _decoded(raw, AppConfig, known, seen)
        self._configs_by_text = seen
        return list(seen.values())

    async def delete_app(self, name: str) -> None:
        await self._call(self._delete(
            keys=[keys.apps(), keys.changes()], args=[name, FEED_LENGTH, "app", name],
        ))

    async def _put(self, hash_key: str, field: str, payload: bytes, guard: float,
                   guard_field: str, kind: str, feed_key: str) -> None:
        await self._call(self._put_guarded(
            keys=[hash_key, keys.changes()],
            args=[field, payload, guard, guard_field, FEED_LENGTH, kind, feed_key],
        ))

    async def changes(self, after: str | None = None, block_s: float | None = None,
                      feed: Feed = ROUTES) -> AsyncIterator[Change]:
        stream = _stream(feed)
        last = after if after is not None else await self.feed_position(feed)
        block_ms = FEED_BLOCK_MS if block_s is None else \
            max(1, min(int(block_s * 1000), LONG_FEED_BLOCK_MS))
        client = self._feed if block_ms <= FEED_BLOCK_MS else self._long_feed
        while True:
            reply = await self._call(
                client.xread({stream: last}, block=block_ms, count=500)
            )
            for _key, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    yield Change(seq=entry_id, kind=fields["kind"], key=fields["key"])

    async def publish_placement(self, advert: PlacementAdvert, ttl_s: float) -> None:
        try:
            await self._publish_placement(
                keys=[keys.placements()],
                args=[advert.id, max(1, int(ttl_s * 1000)), msgspec.json.encode(advert)])
        except (RedisError, OSError) as exc:
            raise RegistryUnavailable(str(exc)) from exc

    async def placements(self) -> list[PlacementAdvert]:
        try:
            raws: list[str] = await self._placements(keys=[keys.placements()], args=[])
        except (RedisError, OSError) as exc:
            raise RegistryUnavailable(str(exc)) from exc
        found = []
        for raw in raws:
            try:
                found.append(msgspec.json.decode(raw, type=PlacementAdvert))
            except msgspec.DecodeError:  # another version's, or damaged: not a placement
                continue
        return sorted(found, key=lambda advert: advert.id)

    async def generation(self) -> str:
        return str(await self._call(self._generation(keys=[keys.generation()],
                                                     args=[secrets.token_hex(8)])))

    def on_connect(self, callback: Callable[[], None]) -> None:
        for client in (self._r, self._feed, self._long_feed):
            pool = client.connection_pool
            assert isinstance(pool, WaitingPool)
            pool.connected.append(callback)

    async def mark_republished(self, generation: str) -> None:
        await self._call(self._mark_republished(
            keys=[keys.generation(), keys.republished(), keys.changes()],
            args=[generation, FEED_LENGTH]))

    async def republished(self) -> str:
        return str(await self._call(self._r.get(keys.republished())) or "")

    async def feed_position(self, feed: Feed = ROUTES) -> str:
        newest = await self._call(self._r.xrevrange(_stream(feed), count=1))
        return str(newest[0][0]) if newest else "0-0"

    def with_own_connections(self) -> RedisRegistry:
        return RedisRegistry(self._url, timeout_s=self._timeout_s)

    async def close(self) -> None:
        await self._r.aclose()
        await self._feed.aclose()
        await self._long_feed.aclose()
