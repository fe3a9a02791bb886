"""Placement configuration: frozen, validated at start, units in names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ground.auth.sealing import SecretKeys
from ground.auth.signing import NO_CLUSTER_KEY, KeyRing
from ground.auth.tickets import RouteKeys
from ground.hostnames import BadHost, normalize_host
from imagecache.core.egress import EgressPolicy
from placement.core.market import DEFAULT_UTILITY, MarketParams, UtilityPoints
from placement.store.factory import check_store_url


@dataclass(frozen=True)
class PlacementConfig:
    state_dir: Path
    store: str = "sqlite"  # or postgresql://USER@HOST:PORT/DB, shared by placements
    cluster_keys: KeyRing | None = None  # signs agent calls, checks the edge's; required
    admin_token: str = ""  # the bootstrap admin token ("": only stored tokens)
    secret_keys: SecretKeys | None = None  # apps' secrets at rest (None: secrets refused)
    route_keys: RouteKeys | None = None  # tickets for machines placed (ground/auth/tickets.py)
    domain: str = "localhost"  # {app}.{domain} is each app's own name; hosts stay out of it
    egress: EgressPolicy = field(default_factory=EgressPolicy)  # where images may come from
    resolve_timeout_s: float = 20.0  # resolving an image at create or deploy
    host: str = "127.0.0.1"
    port: int = 4280  # 0: any free port
    # HTTPS on `port` (PEM chain and its key; both or neither): the API, /internal and
    # health are then served over TLS only
    tls_cert: str = ""
    tls_key: str = ""
    # the URL edges reach this placement's API at, advertised in the registry (sealed with
    # the route key; edges discover it); "": http(s)://HOST:PORT as served, unless HOST
    # is a wildcard (then none is advertised)
    advertise_url: str = ""
    advertise_ttl_s: float = 15.0  # the advert lapses this long after placement stops
    store_pool_size: int = 32  # connections to a PostgreSQL store (callers beyond wait)
    admin_host: str = "127.0.0.1"  # /metrics /healthz /readyz: loopback unless told
    admin_port: int = 0  # 0: any free port
    heartbeat_interval_s: float = 1.0  # the agents'; a worker is healthy for 3 of them
    heartbeats_fresh: int = 3
    # a worker failed on evidence beyond its heartbeat (edges' reports, a failed probe)
    # stays failed this long unless it comes back under a new epoch (core/failures.py)
    failed_mark_s: float = 30.0
    reference_bandwidth_bytes_per_s: float = 100e6
    reference_pull_time_s: float = 2.0
    utility_points: UtilityPoints = DEFAULT_UTILITY
    candidate_threshold: int = 128
    max_offers: int = 3
    offer_timeout_s: float = 5.0  # one offer (or agent call) before it counts as unreachable
    agent_connections: int = 256  # to agents, per pool (calls; owners' long-poll waits)
    pull_timeout_s: float = 120.0
    wake_margin_ms: int = 50  # a wake answers this long before its deadline
    decisions_kept: int = 50  # per app, for GET /v1/apps/{app}/placements

    def __post_init__(self) -> None:
        if self.cluster_keys is None:
            raise ValueError(NO_CLUSTER_KEY)
        try:
            if normalize_host(self.domain) != self.domain:
                raise ValueError(f"domain must be written as {normalize_host(self.domain)!r}")
        except BadHost as exc:
            raise ValueError(f"domain: {exc}") from None
        check_store_url(self.store)
        for name in ("port", "admin_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"{name} must be in 0..65535")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls cert and key go together")
        for name in ("heartbeat_interval_s", "reference_bandwidth_bytes_per_s",
                     "reference_pull_time_s", "offer_timeout_s", "pull_timeout_s",
                     "resolve_timeout_s", "advertise_ttl_s", "failed_mark_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("heartbeats_fresh", "candidate_threshold", "max_offers", "decisions_kept",
                     "agent_connections", "store_pool_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.wake_margin_ms < 0:
            raise ValueError("wake_margin_ms must be >= 0")
        xs = [x for x, _ in self.utility_points]
        if len(xs) < 2 or xs != sorted(xs) or any(not 0 <= y <= 1 for _, y in self.utility_points):
            raise ValueError("utility_points: at least two (x, y) sorted by x, y in [0, 1]")

    def market(self) -> MarketParams:
        return MarketParams(
            heartbeat_freshness_s=self.heartbeat_interval_s * self.heartbeats_fresh,
            reference_bandwidth_bytes_per_s=self.reference_bandwidth_bytes_per_s,
            reference_pull_time_s=self.reference_pull_time_s,
            utility_points=self.utility_points,
            candidate_threshold=self.candidate_threshold,
        )
