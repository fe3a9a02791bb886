"""The edge's in-memory view of apps and machines.

Nothing on the hot path touches the registry: routing and balancing read this
view, which edge/adapters/registry_feed.py keeps. What the edge learnt itself
(a wake answered, a machine refused connects, placement stopped a machine)
wins over registry records older than that moment. The shell hears of changes
that matter to held requests through three hooks: a machine became routable
from the feed, a machine stopped serving, an app was deleted.

Routing fails closed: `{app}.{domain}` always reaches that app; an app's own
`hosts` never name the edge's domain or a name under it (ignored: placement
forbids them), and a host two apps claim reaches neither.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec

from edge.core import thawpick
from edge.core.stats import AppStats
from ground.appconfig import AppConfig
from ground.registry import MachineRecord
from ground.registry.types import boot_span_ms

log = logging.getLogger("thaw.edge.view")

STARTED = "started"
LOST = "lost"  # its worker is failed (placement says so): no answer will come from it
MAX_TOMBSTONES = 10_000  # machines the edge remembers having seen die


class MachineSlot:
    """One machine as the edge sees it. `last_start` is loop time of the last request start
    (by this edge)."""

    __slots__ = ("address", "app", "draining", "elsewhere", "host", "id", "in_flight",
                 "known_wall", "last_start", "pool_key", "port", "seen", "state", "tunnels",
                 "worker")

    def __init__(self, app: str, machine_id: str, address: str, state: str, now: float,
                 worker: str = "") -> None:
        self.app = app
        self.id = machine_id
        self.worker = worker
        self.address = address
        host, _, port = address.rpartition(":")
        self.host = host.strip("[]") or "127.0.0.1"
        self.port = int(port) if port.isdigit() else 0
        # Upstream connections are this machine's own: never shared with, nor cut for,
        # another record that names the same address (a worker may route its own
        # machines to any address; it must not reach another machine's connections).
        self.pool_key = f"{machine_id}@{address}"
        self.state = state
        self.in_flight = 0  # requests at the machine: this edge's, plus `elsewhere`
        self.elsewhere = 0  # other edges' requests at it, as last shared (edge/loadshare)
        self.tunnels = 0  # of in_flight, this edge's WebSocket upgrades and tunnels
        self.last_start = now
        self.draining = False
        self.known_wall = 0.0  # wall time of the edge's own knowledge; older records lose
        self.seen = False  # the registry has had a record of it

    @property
    def routable(self) -> bool:
        return self.state == STARTED and not self.draining and self.port > 0


class AppEntry:
    """An app's config, machines and counters; `routable` is rebuilt on every change.
    `stats` is what /metrics says of the app: it goes with the entry when the app does."""

    def __init__(self, config: AppConfig) -> None:
        self.config = config
        self.name = config.name  # read on every request: an attribute, not a property
        self.machines: dict[str, MachineSlot] = {}
        self.routable: list[MachineSlot] = []
        # its machines the registry says are suspended or starting (records admitted by
        # the route guard, this incarnation's): what `to_thaw` chooses from
        self.resting: dict[str, MachineRecord] = {}
        self.in_flight = 0
        self.stats = AppStats()
        self.h2c = config.protocol == "h2c"  # its machines are spoken to in HTTP/2

    def configure(self, config: AppConfig) -> None:
        if config.uid != self.config.uid:
            self.resting.clear()  # another incarnation's machines are never this one's
        self.config = config
        self.h2c = config.protocol == "h2c"

    def rebuild(self) -> None:
        self.routable = [m for m in self.machines.values() if m.routable]

    def to_thaw(self, region: str) -> MachineRecord | None:
        """The suspended machine a wake of this app in `region` would resume first
        (edge/core/thawpick.py), when the app has no machine up here; else None."""
        if self.machines or not self.resting:
            return None
        return thawpick.to_thaw(self.resting.values(), self.config, region)


class View:
    def __init__(self, domain: str, clock: Callable[[], float],
                 wall: Callable[[], float] = time.time) -> None:
        self.domain = domain.lower().rstrip(".")
        self.domain_suffix = "." + self.domain
        self.clock = clock
        self.wall = wall
        self.apps: dict[str, AppEntry] = {}
        self.hosts: dict[str, str] = {}  # an app's own host name -> the one app claiming it
        self._claims: dict[str, set[str]] = {}  # an app's own host name -> every claimant
        self._claimed: dict[str, set[str]] = {}  # app -> the host names it claims
        self._contested_news: set[str] = set()  # said at the end of the change
        self._ignored_news: set[str] = set()
        self._routes: dict[str, AppEntry] = {}  # host -> app, filled by route()
        # (app, machine id) -> wall time the edge saw it stop serving: a registry record
        # older than that (a dead host's last word) must not bring it back.
        self.tombstones: dict[tuple[str, str], float] = {}
        self.on_machine_removed: Callable[[MachineSlot], None] = lambda slot: None
        # a machine became routable through the registry (its boot ms from its events)
        self.on_machine_added: Callable[[MachineSlot, float], None] = lambda slot, ms: None
        self.on_app_removed: Callable[[str], None] = lambda name: None
        # an app's settings or a machine may have changed (from the registry or a wake)
        self.on_change: Callable[[], None] = lambda: None
        # may a registry record be routed by (edge/routeguard.py): one that may not is
        # ignored, as if never written
        self.admit: Callable[[str, MachineRecord], bool] = lambda app, record: True

    def route(self, host: str) -> AppEntry | None:
        """The app serving `host` (lower-case, without port or trailing dot), or None."""
        entry = self._routes.get(host)
        if entry is not None:
            return entry
        if host.endswith(self.domain_suffix):
            name: str | None = host[: -len(self.domain_suffix)]
        else:
            name = self.hosts.get(host)
        entry = self.apps.get(name) if name else None
        if entry is not None:
            # Only hosts that reach an app are remembered (at most one per app name and
            # extra host), so unknown hosts cannot grow it.
            self._routes[host] = entry
        return entry

    def set_app(self, name: str, config: AppConfig | None) -> None:
        """One app changed (None: deleted). Costs the app's own hosts, not every app's."""
        self.on_change()
        self._put_app(name, config)
        self._report_hosts()

    def set_apps(self, configs: list[AppConfig], *, prune: bool = True) -> None:
        """Every app at once (a full load): those not in `configs` are deleted, unless
        `prune` is false (the registry is being filled again after it was lost)."""
        self.on_change()
        names = {config.name for config in configs}
        for name in [name for name in self.apps if prune and name not in names]:
            self._put_app(name, None)
        for config in configs:
            self._put_app(config.name, config)
        self._report_hosts()

    def _put_app(self, name: str, config: AppConfig | None) -> None:
        entry = self.apps.get(name)
        if config is None:
            if entry is not None:
                del self.apps[name]
                self._claim(name, [])
                self._routes.clear()  # some may lead to the entry that went
                for slot in entry.machines.values():
                    self.on_machine_removed(slot)
                self.on_app_removed(name)
        elif entry is None:
            self.apps[name] = AppEntry(config)
            self._claim(name, config.hosts)
        else:
            if config.hosts != entry.config.hosts:
                self._claim(name, config.hosts)
            entry.configure(config)

    def _claim(self, app: str, raw_hosts: list[str]) -> None:
        """`app` now claims `raw_hosts` (compared lower-case without a trailing dot): only
        the host names it gained or lost are settled again. One under (or equal to) the
        edge's domain is ignored; one claimed by two apps routes to none."""
        claimed: set[str] = set()
        for raw in raw_hosts:
            host = raw.lower().rstrip(".")
            if host == self.domain or host.endswith(self.domain_suffix):
                self._ignored_news.add(host)
            elif host:
                claimed.add(host)
        before = self._claimed.pop(app, set())
        if claimed:
            self._claimed[app] = claimed
        if claimed == before:
            return
        for host in before - claimed:
            claimants = self._claims[host]
            claimants.discard(app)
            if not claimants:
                del self._claims[host]
            self._settle(host)
        for host in claimed - before:
            self._claims.setdefault(host, set()).add(app)
            self._settle(host)
        self._routes.clear()

    def _settle(self, host: str) -> None:
        claimants = self._claims.get(host)
        if claimants is not None and len(claimants) == 1:
            self.hosts[host] = next(iter(claimants))
            return
        self.hosts.pop(host, None)
        if claimants is not None:
            self._contested_news.add(host)

    def _report_hosts(self) -> None:
        """Say once which host names became contested or were ignored in this change."""
        contested = {host: sorted(self._claims[host]) for host in self._contested_news
                     if len(self._claims.get(host, ())) > 1}
        if contested:
            log.warning("hosts claimed by several apps route to none: %s", contested)
        if self._ignored_news:
            log.warning("app hosts under the edge's domain %s are ignored: %s", self.domain,
                        sorted(self._ignored_news))
        self._contested_news.clear()
        self._ignored_news.clear()

    def apply_record(self, app: str, machine_id: str, record: MachineRecord | None) -> None:
        """A registry record (None: deleted) for one machine, unless the edge knows better."""
        self.on_change()
        entry = self.apps.get(app)
        if entry is None or (record is not None and not self.admit(app, record)):
            return
        # A resting record (a thaw candidate) is never routed by, so neither what the edge
        # learnt of the machine since nor a tombstone holds it back: an auto-stop this
        # edge asked for marks the machine after its `suspended` was written.
        entry.resting.pop(machine_id, None)
        if (record is not None and record.state in thawpick.RESTING
                and record.app_uid == entry.config.uid):
            entry.resting[machine_id] = msgspec.structs.replace(record, events=[])
        slot = entry.machines.get(machine_id)
        if slot is not None and record is not None and record.updated_at < slot.known_wall:
            return
        died = self.tombstones.get((app, machine_id))
        if died is not None:
            if record is not None and record.updated_at < died:
                return
            del self.tombstones[(app, machine_id)]  # a newer word from its worker
        if record is not None and record.app_uid != entry.config.uid:
            # a machine of another incarnation of this name (an earlier app's leftover):
            # never this app's, whatever its state
            self._drop(entry, machine_id, "foreign")
            return
        if record is None or record.state != STARTED or not record.address:
            if slot is not None and record is None and not slot.seen:
                return  # woken machines may reach the registry after the wake answer
            self._drop(entry, machine_id, record.state if record else "destroyed")
            return
        was_routable = slot is not None and slot.routable
        if slot is None or slot.address != record.address:
            slot = MachineSlot(app, machine_id, record.address, STARTED, self.clock(),
                               record.worker)
            entry.machines[machine_id] = slot
            was_routable = False
        slot.state = STARTED
        slot.seen = True
        entry.rebuild()
        if not was_routable and slot.routable:
            self.on_machine_added(slot, boot_span_ms((e.state, e.at) for e in record.events))

    def add_started(self, app: str, machine_id: str, address: str,
                    worker: str = "") -> MachineSlot | None:
        """A machine placement just reported started (a wake answer)."""
        self.on_change()
        entry = self.apps.get(app)
        if entry is None:
            return None
        slot = entry.machines.get(machine_id)
        if slot is None or slot.address != address:
            slot = MachineSlot(app, machine_id, address, STARTED, self.clock(), worker)
            entry.machines[machine_id] = slot
        entry.resting.pop(machine_id, None)
        slot.state = STARTED
        slot.draining = False
        slot.last_start = self.clock()
        slot.known_wall = self.wall()
        self.tombstones.pop((app, machine_id), None)
        entry.rebuild()
        return slot

    def mark(self, slot: MachineSlot, state: str) -> None:
        """The edge learnt `slot` is no longer serving (gone, stopped, suspended)."""
        slot.known_wall = self.wall()
        entry = self.apps.get(slot.app)
        if entry is not None and entry.machines.get(slot.id) is slot:
            self._drop(entry, slot.id, state)
        if len(self.tombstones) >= MAX_TOMBSTONES:
            self.tombstones.pop(next(iter(self.tombstones)))  # the oldest
        self.tombstones[(slot.app, slot.id)] = slot.known_wall

    def worker_failed(self, worker: str) -> int:
        """Placement counts `worker` failed: none of its machines is routed to (until the
        registry says otherwise with newer news). How many were dropped."""
        for entry in self.apps.values():  # not thawed by the edge either
            for machine_id in [m for m, r in entry.resting.items() if r.worker == worker]:
                del entry.resting[machine_id]
        lost = [slot for entry in self.apps.values() for slot in entry.machines.values()
                if slot.worker == worker]
        for slot in lost:
            self.mark(slot, LOST)
        return len(lost)

    def set_draining(self, slot: MachineSlot, draining: bool) -> None:
        slot.draining = draining
        entry = self.apps.get(slot.app)
        if entry is not None:
            entry.rebuild()

    def _drop(self, entry: AppEntry, machine_id: str, state: str) -> None:
        slot = entry.machines.pop(machine_id, None)
        if slot is not None:
            slot.state = state
            entry.rebuild()
            self.on_machine_removed(slot)
