"""Edge configuration: frozen, validated at start, units in names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edge.core.forwarding import parse_networks
from edge.core.kernelwall import check_table
from edge.core.placementorder import parse_urls
from ground.auth.signing import NO_CLUSTER_KEY, KeyRing
from ground.auth.tickets import RouteKeys


@dataclass(frozen=True)
class TlsConfig:
    """HTTPS on its own port; certificates, SNI, ALPN and rotation: edge/adapters/tls.py."""

    cert: str = ""  # default certificate chain (PEM)
    key: str = ""  # its private key (PEM)
    cert_dir: str = ""  # more certificates, chosen by SNI (see the module's doc)
    port: int = 8443  # 0: any free port
    rotate_s: float = 3600.0  # contexts (ticket keys, certificate files) made again
    # Strict-Transport-Security: max-age on answers over TLS (0: none), unless the machine
    # sent its own
    hsts_max_age_s: int = 0
    handshake_timeout_s: float = 10.0  # a connection not through its handshake is closed
    max_handshakes: int = 1000  # in progress at once; a connection past it is closed at once
    # local development only (`thaw up --tls`): makes a certificate for a name it was not
    # given, (cert PEM, key PEM) for that name, or None
    issuer: Callable[[str], tuple[bytes, bytes] | None] | None = None

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("tls cert and key go together")
        if not (self.cert or self.cert_dir or self.issuer):
            raise ValueError("TLS needs a certificate (cert and key) or a certificate directory")
        if not 0 <= self.port < 65536:
            raise ValueError("tls port must be in 0..65535")
        for name in ("rotate_s", "handshake_timeout_s", "max_handshakes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"tls {name} must be > 0")
        if not 0 <= self.hsts_max_age_s <= 2 ** 31:
            raise ValueError("tls hsts_max_age_s must be in 0..2**31")


@dataclass(frozen=True)
class EdgeConfig:
    # e.g. http://127.0.0.1:4280, or https://; several, comma-separated: a wake one does
    # not answer is asked of the next (edge/core/placementorder.py)
    placement_url: str
    placement_cafile: str = ""  # the CA (PEM) an https placement is checked against ("":
    #                             the system's)
    # also ask the placements that publish themselves in the registry (sealed with the
    # route key: route_keys required, see docs/scaling-out.md)
    discover_placements: bool = True
    # thaw a suspended machine through its agent beside the wake that would resume it
    # (edge/adapters/thaw.py); off: only placement's wake does
    direct_thaw: bool = True
    domain: str = "localhost"  # Host "{app}.{domain}" routes to app
    host: str = "127.0.0.1"
    port: int = 8080  # proxy port; 0: any free port
    admin_host: str = "127.0.0.1"
    admin_port: int = 0  # /metrics /healthz /v1/state; 0: any free port
    region: str = "local"
    max_header_bytes: int = 65536  # request line + headers
    max_headers: int = 100
    max_body_bytes: int = 1 << 30
    header_timeout_s: float = 10.0  # from the first byte of a request to the end of its head
    idle_timeout_s: float = 60.0  # keep-alive connection with no request in progress
    max_held_total: int = 10000
    max_held_share: float = 0.1  # of max_held_total, what one app may hold (holdqueue)
    resync_interval_s: float = 30.0
    autostop_interval_s: float = 1.0
    load_share_interval_s: float = 0.25  # loads shared with other edges (edge/loadshare)
    upstream_connect_timeout_s: float = 5.0
    upstream_idle_timeout_s: float = 30.0  # pooled idle connections older than this are closed
    response_timeout_s: float = 60.0  # forwarded request: longest time with no byte moving
    tunnel_idle_timeout_s: float = 300.0  # a WebSocket tunnel with no byte either way closes
    # of a machine's hard_limit, what WebSocket tunnels may hold: the rest is for requests
    # (edge/core/balance.py `tunnel_limit`)
    tunnel_share: float = 0.8
    upstream_pool_per_machine: int = 256  # idle connections kept per machine
    upstream_quickack: bool = True  # ACK a response split across reads at once (see upstream)
    wake_grace_s: float = 2.0  # extra seconds the wake call may take past its deadline
    wake_retry_after_s: int = 1  # Retry-After on 503 answers
    body_buffer_bytes: int = 256 * 1024  # request body buffered while held before pausing
    write_buffer_high_bytes: int = 256 * 1024  # transport write buffer high-water mark
    max_connect_attempts: int = 3  # machines tried per request before it is held
    # times a request is sent again after a machine closed the connection without
    # answering (edge/core/exchange.py `after_loss`): a request of death is bounded
    max_resends: int = 2
    shutdown_grace_s: float = 5.0  # stop(): time given to in-flight responses
    h2: bool = True  # serve HTTP/2: h2c with prior knowledge, and h2 by ALPN over TLS
    h2_websockets: bool = True  # WebSockets over HTTP/2 (RFC 8441 extended CONNECT)
    h2_max_concurrent_streams: int = 100  # per connection (Envoy's default)
    h2_stream_window_bytes: int = 256 * 1024  # a stream's request-body receive window
    h2_stream_buffer_bytes: int = 256 * 1024  # response bytes queued per stream before the
    #                                           machine's reading pauses
    h2_header_table_bytes: int = 4096  # HPACK dynamic table the client may make us keep
    h2_resets_per_s: float = 100.0  # stream resets by the client (rapid reset), burst 2x
    h2_control_frames_per_s: float = 20.0  # SETTINGS and PING frames each, burst 2x
    h2_max_continuations: int = 16  # CONTINUATION frames in one header block
    # per client (peer address; trusted proxies exempt), over all its connections
    # (edge/core/clients.py): beyond, 429 / GOAWAY and close for that client alone
    max_conns_per_client: int = 1024
    new_conns_per_s: float = 500.0  # per client
    # a client's burst of new connections past which they are spread at new_conns_per_s
    new_conns_burst: int = 256
    h2_client_resets_per_s: float = 200.0  # stream resets per client, bursts of twice that
    # requests one client may begin per turn of the event loop, over all its connections;
    # the rest wait, unread, for the next turn (edge/core/clients.py)
    client_requests_per_turn: int = 8
    # requests one client may have held (waiting for a machine) over all apps; beyond: 429
    # too_many_held for it alone (edge/core/holdqueue.py). A client here is the address a
    # trusted proxy names; a trusted proxy's own requests are not bounded
    max_held_per_client: int = 256
    # WebSocket tunnels one client may hold open (or have asked for) over all apps; beyond:
    # 429 too_many_tunnels for it alone. An app's tunnels are bounded per machine
    # (tunnel_share); this keeps one client from taking all of them from the app's other
    # clients, and bounds the set-up work (an upstream connection each) one client can
    # ask of the edge. The client is the same as for max_held_per_client
    max_tunnels_per_client: int = 64
    underscore_headers: str = "drop"  # "drop" | "reject": request header names with "_"
    # peers believed about the client (X-Forwarded-For): CIDRs of the proxies in front of
    # the edge; none by default: every peer is the client (edge/core/forwarding.py)
    trusted_proxies: tuple[str, ...] = ()
    # "" off; else the nftables table (inet) in which the kernel drops barred clients and
    # SYN floods before the edge sees them (edge/core/kernelwall.py; needs CAP_NET_ADMIN)
    nft_table: str = ""
    cluster_keys: KeyRing | None = None  # signs calls to placement's /internal; required
    # machine records are routed by only when sealed (ground/auth/tickets.py); None: all are
    route_keys: RouteKeys | None = None
    tls: TlsConfig | None = None  # also serve HTTPS (HTTP/1.1 and h2 by ALPN) on tls.port
    # JSON lines, one per answer (edge/core/accesslog.py): "" off, "stdout" (or "-"), or a
    # file path (appended to; reopened when moved away)
    access_log: str = ""
    access_log_sample_rate: float = 1.0  # share of warm non-5xx answers logged; cold and
    #                                      5xx ones always are

    def __post_init__(self) -> None:
        if self.cluster_keys is None:
            raise ValueError(NO_CLUSTER_KEY)
        if not self.placement_urls or not all(
                u.startswith(("http://", "https://")) for u in self.placement_urls):
            raise ValueError("placement_url must be one or more http(s) URLs, comma-separated")
        if not self.domain or self.domain.startswith("."):
            raise ValueError("domain must be a host name without a leading dot")
        for name in ("port", "admin_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"{name} must be in 0..65535")
        for name in (
            "max_header_bytes", "max_headers", "max_body_bytes", "header_timeout_s",
            "idle_timeout_s", "resync_interval_s", "autostop_interval_s",
            "load_share_interval_s",
            "upstream_connect_timeout_s", "upstream_idle_timeout_s", "body_buffer_bytes",
            "response_timeout_s", "tunnel_idle_timeout_s",
            "write_buffer_high_bytes", "max_connect_attempts", "h2_max_concurrent_streams",
            "h2_stream_window_bytes", "h2_stream_buffer_bytes", "h2_resets_per_s",
            "h2_control_frames_per_s", "h2_max_continuations", "max_conns_per_client",
            "new_conns_per_s", "new_conns_burst", "h2_client_resets_per_s",
            "client_requests_per_turn", "max_held_per_client", "max_tunnels_per_client",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("max_held_total", "upstream_pool_per_machine", "wake_grace_s", "max_resends",
                     "wake_retry_after_s", "shutdown_grace_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not self.region:
            raise ValueError("region must not be empty")
        if self.underscore_headers not in ("drop", "reject"):
            raise ValueError('underscore_headers must be "drop" or "reject"')
        parse_networks(self.trusted_proxies)  # ValueError naming the one that is not
        if self.nft_table:
            check_table(self.nft_table)
        self._check_shares()

    def _check_shares(self) -> None:
        if not 0.0 < self.tunnel_share <= 1.0:
            raise ValueError("tunnel_share must be in (0, 1]")
        if not 0.0 < self.max_held_share <= 1.0:
            raise ValueError("max_held_share must be in (0, 1]")
        if not 0.0 <= self.access_log_sample_rate <= 1.0:
            raise ValueError("access_log_sample_rate must be in [0, 1]")

    @property
    def watch_every_s(self) -> float:
        """How often an HTTP/1 connection's watchdog looks at its timeouts (and how late an
        idle one may be parked: edge/core/parking.py's slack)."""
        return min(self.header_timeout_s, self.idle_timeout_s, self.response_timeout_s,
                   self.tunnel_idle_timeout_s) / 4

    @property
    def placement_urls(self) -> tuple[str, ...]:
        """The placements given, in the order given (the first is asked first)."""
        return parse_urls(self.placement_url)
