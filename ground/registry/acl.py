"""The Redis ACL of each role (edge, agent, placement): which keys it may read or write,
with which commands, built from `keys.py` so that it follows the key layout.

A role's user may run only the commands listed here, each only on the keys listed
with it (a Redis 7 selector per grant: `(%R~PATTERN +cmd ...)` or `(~PATTERN +cmd ...)`),
plus a few commands on no key (PING, TIME) and the scripts' EVALSHA (EVALSHA_RO), which
may name any key of the role's (EVALSHA only those it may write). Pub/sub only on the
channels listed (`CHANNELS`: placement's lease releases). Every other command —
FLUSHALL, CONFIG, KEYS, SCAN, DEBUG, SHUTDOWN, MODULE, ACL, SCRIPT FLUSH, other pub/sub —
is denied. A script's `redis.call` is checked against the same rules, so a user that may
run scripts can do in them only what it may do directly.

An agent's user made for one worker (`worker="w1"`) writes that worker's keys only
(`thaw:worker:w1`, `thaw:worker-epoch:w1`, `thaw:worker-layers:w1`); what it must still
share with every worker is listed in `SHARED_BY_AGENTS` and in docs/security.md.
Pure: no IO.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ground.registry import keys

ROLES = ("edge", "agent", "placement")
ANY = "*"
WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # no glob character
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# What redis-py sends on connecting (CLIENT SETINFO, new in Redis 7.2, may be refused:
# redis-py ignores that), and the scripts' own commands (their keys are
# checked again on each redis.call inside). SCRIPT LOAD only loads: FLUSH/KILL stay denied.
CONNECTION = ("ping", "select", "time")
SCRIPTS = ("evalsha", "evalsha_ro", "script|load")
# The channels a role may publish and subscribe to (and the commands for it): placement
# hears its leases' releases (placement/adapters/coordination.py, placement/wakes/wakeclaims.py).
CHANNELS = {"placement": (keys.lease_released(),)}
PUBSUB = ("publish", "subscribe", "unsubscribe")


@dataclass(frozen=True)
class Grant:
    """`commands` on the keys matching `pattern`; `write`: read and write, else read only."""

    pattern: str
    write: bool
    commands: tuple[str, ...]

    @property
    def keys(self) -> str:
        return ("~" if self.write else "%R~") + self.pattern

    def selector(self) -> str:
        return "(" + " ".join([self.keys, *(f"+{c}" for c in self.commands)]) + ")"


def _family(key: str, last: str) -> str:
    """The pattern of a key family: `key` (built with ANY as its last part) as is; a
    check that keys.py still ends that family with its variable part."""
    if not key.endswith(last):
        raise AssertionError(f"key layout changed: {key!r}")  # pragma: no cover
    return key


def _reports() -> str:
    return _family(keys.worker_reports(ANY, 0)[:-1] + ANY, ANY)


HASH_READ = ("hget", "hgetall", "hvals", "hkeys")
FEED_READ = ("xread", "xrevrange")
EXPIRING = ("hgetall", "hset", "hdel", "pttl", "pexpire")  # lua.UNEXPIRED hashes


def _generation() -> Grant:
    # Every role may set it when absent (the first to start after Redis lost its data).
    return Grant(keys.generation(), True, ("get", "set"))


def _edge() -> list[Grant]:
    return [
        Grant(keys.apps(), False, HASH_READ),
        Grant(keys.republished(), False, ("get",)),
        Grant(keys.machines(ANY), False, HASH_READ),
        Grant(keys.changes(), False, FEED_READ),
        _generation(),
        # (HGET: the share script reads the edge's own entry, news if it lapsed)
        Grant(keys.machine_load(), True, (*EXPIRING, "hget")),
        Grant(keys.machine_load_news(), True, ("xadd", *FEED_READ)),
        Grant(keys.wake_demand(ANY), True, EXPIRING),
        Grant(keys.placements(), False, ("hgetall",)),
        # one worker's heartbeat by id: its agent's URL, for the edge's own thaw of a
        # suspended machine (edge/adapters/thaw.py); never the list, never a write
        Grant(keys.worker(ANY), False, ("get",)),
    ]


def _agent(worker: str) -> list[Grant]:
    return [
        Grant(keys.worker(worker), True, ("set",)),
        Grant(keys.worker_epoch(worker), True, ("get", "set")),
        # (HDEL: the start check's; DEL already lets it drop its own record)
        Grant(keys.worker_layers(worker), True, ("hkeys", "hset", "hdel", "del")),
        Grant(keys.workers(), True, ("sadd",)),
        Grant(keys.layer_holders(ANY), True, ("hset", "hdel")),
        Grant(keys.machines(ANY), True, ("hget", "hset", "hdel")),
        Grant(keys.changes(), True, ("xadd",)),
        Grant(keys.worker_changes(), True, ("xadd",)),
        _generation(),
    ]


def _placement() -> list[Grant]:
    return [
        Grant(keys.apps(), True, ("hget", "hset", "hdel", "hvals")),
        Grant(keys.machines(ANY), True, ("hget", "hset", "hdel", "hvals")),
        Grant(keys.changes(), True, ("xadd", *FEED_READ)),
        Grant(keys.worker_changes(), False, FEED_READ),
        Grant(keys.workers(), True, ("smembers", "srem")),
        Grant(keys.worker(ANY), False, ("mget",)),
        Grant(keys.layer_holders(ANY), False, ("hgetall",)),
        _generation(),
        Grant(keys.republished(), True, ("get", "set")),
        Grant(keys.lease(ANY), True, ("get", "set", "del", "pttl", "pexpire")),
        Grant(keys.lease_tokens(), True, ("get", "set")),
        Grant(keys.wake_claims(ANY), True, EXPIRING),
        Grant(keys.wake_demand(ANY), True, (*EXPIRING, "hget")),  # hget: a wake's lapse
        Grant(_reports(), True, (*EXPIRING, "hkeys")),
        Grant(keys.worker_failures(), True, EXPIRING),
        Grant(keys.placements(), True, EXPIRING),
    ]


# Keys every agent writes whatever its worker: no ACL can confine one worker's writes
# there (Redis checks key names, not hash fields). What a stolen agent user could do with
# each is in docs/security.md.
SHARED_BY_AGENTS = (keys.workers(), keys.layer_holders(ANY), keys.machines(ANY),
                    keys.changes(), keys.worker_changes(), keys.generation())


def grants(role: str, worker: str = "") -> list[Grant]:
    """The grants of `role`; `worker` (agents only): confine the agent to that worker's
    keys ("" : any worker's). ValueError for an unknown role or a worker id with a glob
    character or of more than 64 characters."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if worker and role != "agent":
        raise ValueError("a worker id is for the agent role only")
    if worker and not WORKER_ID.match(worker):
        raise ValueError(f"worker id {worker!r}: letters, digits, '.', '_', '-' (at most 64)")
    if role == "edge":
        return _edge()
    if role == "agent":
        return _agent(worker or ANY)
    return _placement()


def probes(role: str, worker: str = "") -> list[tuple[str, str]]:
    """(key, field) pairs whose HDEL a working user of `role` may send and that change
    nothing (no such field): what a service checks its credentials with at start.
    `worker`: an agent's id, whose own keys its user must be able to write."""
    field = "\x00thaw-credentials-check"
    grants(role, worker)  # the same ValueErrors
    if role == "edge":
        return [(keys.machine_load(), field)]
    if role == "placement":
        return [(keys.apps(), field)]
    own = [(keys.worker_layers(worker), field)] if worker else []
    return [*own, (keys.machines(field), field)]


def rules(role: str, password_sha256: str, worker: str = "") -> list[str]:
    """The ACL SETUSER rules (after the user name) of a user of `role` whose password's
    SHA-256 is `password_sha256` (hex): reset first, so setting a user again replaces
    every earlier rule."""
    if not re.fullmatch(r"[0-9a-f]{64}", password_sha256):
        raise ValueError("password_sha256 must be 64 lowercase hex digits")
    granted = grants(role, worker)
    channels = CHANNELS.get(role, ())
    return ["reset", "on", f"#{password_sha256}", "resetchannels",
            *(f"&{channel}" for channel in channels), "-@all",
            *(f"+{c}" for c in (*CONNECTION, *SCRIPTS, *(PUBSUB if channels else ()))),
            *(grant.keys for grant in granted),
            *(grant.selector() for grant in granted)]


def password_sha256(password: str) -> str:
    if not password:
        raise ValueError("the password must not be empty")
    return hashlib.sha256(password.encode()).hexdigest()


def acl_file_line(user: str, role: str, password: str, worker: str = "") -> str:
    """One line of a Redis ACL file (`aclfile`) for `user`; the password only as its hash."""
    if not USER_NAME.match(user) or user == "default":
        raise ValueError(f"user name {user!r}: letters, digits, '.', '_', '-', not 'default'")
    return " ".join(["user", user, *rules(role, password_sha256(password), worker)[1:]])
