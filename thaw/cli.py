"""thaw: a serverless-style edge autoscaler.

Services: `up` (the whole platform in one process), `edge`, `placement`, `agent`.
App owners: `launch`, `deploy`, `apps`, `scale`, `machines`, `logs`, `status`, `releases`,
`rollback`, `events`, `placements`, `image`. Operators: `tokens`, `loadtest`. `--json` on
every one of these prints the API's answer for scripts; `completion` for your shell;
`--debug` shows a failure's traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import importlib.metadata
import os
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ground.logs import setup_logging
from thaw import cmd_registry
from thaw.cmd_registry import add_registry_flags, optional_path, registry_url
from thaw.commands import add_client_commands, run_client_command
from thaw.loadtest import add_parser as loadtest_parser
from thaw.loadtest import run as run_loadtest

if TYPE_CHECKING:
    from imagecache.core.egress import EgressPolicy
    from thaw.up import UpConfig


def env_default(name: str, default: str) -> str:
    return os.environ.get(f"THAW_{name}", default)


def env_list(name: str) -> list[str]:
    return [item for item in os.environ.get(f"THAW_{name}", "").split(",") if item.strip()]


def add_cluster_key_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster-key-file", type=Path, default=None, metavar="PATH",
                   help="the cluster key(s) that sign internal calls (else $THAW_CLUSTER_KEY)")


def add_route_key_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--route-key-file", type=Path, default=None, metavar="PATH",
                   help="the route key(s), newest first (0600; the same on every placement "
                        "and edge, never on agents): only machine records sealed by a ticket "
                        "placement gave their worker are routed (else $THAW_ROUTE_KEY_FILE)")


def add_egress_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-registry", action="append", default=env_list("ALLOW_REGISTRIES"),
                   metavar="HOST[:PORT]",
                   help="an image registry allowed even at a private address (repeatable)")
    p.add_argument("--only-allowed-registries", action="store_true",
                   default=env_default("ONLY_ALLOWED_REGISTRIES", "") == "1",
                   help="refuse every registry not given with --allow-registry (token realms "
                        "and redirects, e.g. to a CDN, must still be public or allowed)")
    p.add_argument("--allow-layout", action="append", default=env_list("ALLOW_LAYOUTS"),
                   metavar="DIR", help="a directory whose oci: image layouts may be used "
                                       "(repeatable)")


def egress_policy(args: argparse.Namespace) -> EgressPolicy:
    from imagecache.core.egress import EgressPolicy

    return EgressPolicy.build(args.allow_registry, listed_only=args.only_allowed_registries,
                              layout_dirs=[str(Path(d).resolve()) for d in args.allow_layout])


def add_driver_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--driver", choices=["auto", "oci", "bubblewrap", "process"],
                   default=env_default("DRIVER", "auto"))
    p.add_argument("--runtime", default=env_default("RUNTIME", "runc"),
                   help="the OCI runtime: runc, crun, runsc or a path")


def agent_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent", help="run a worker agent")
    e = env_default
    p.add_argument("--host", default=e("AGENT_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(e("AGENT_PORT", "0")))
    p.add_argument("--state-dir", type=Path, default=Path(e("STATE_DIR", ".thaw/agent")))
    p.add_argument("--region", default=e("REGION", "local"))
    p.add_argument("--cpus", type=float, default=float(e("CPUS", str(os.cpu_count()))))
    p.add_argument("--memory-mb", type=int, default=int(e("MEMORY_MB", "4096")))
    add_registry_flags(p)
    p.add_argument("--id", default=e("WORKER_ID", ""), help="worker id (default: in state dir)")
    p.add_argument("--cache-budget-mb", type=int, default=int(e("CACHE_BUDGET_MB", "2048")))
    p.add_argument("--heartbeat-s", type=float, default=float(e("HEARTBEAT_S", "1.0")))
    add_driver_flags(p)
    p.add_argument("--machine-cidr", default=e("MACHINE_CIDR", "10.213.0.0/16"))
    p.add_argument("--machine-pids-max", type=int, default=int(e("MACHINE_PIDS_MAX", "1024")))
    p.add_argument("--machine-egress", choices=["public", "none"],
                   default=e("MACHINE_EGRESS", "public"))
    p.add_argument("--stop-machines-on-exit", action="store_true")
    p.add_argument("--sweep", action="store_true",
                   help="remove what this state dir's machines have on the host (containers, "
                        "mounts, network namespaces, claims) and exit; for an agent that "
                        "is gone (killed) and whose state is to be removed")
    p.add_argument("--repair", action="store_true",
                   help="start from the valid part of a damaged op log (a copy of it is kept)")
    p.add_argument("--advertise-url", default=e("ADVERTISE_URL", ""),
                   help="the URL placement reaches this agent at (default http://HOST:PORT)")
    add_cluster_key_flag(p)
    add_egress_flags(p)
    p.add_argument("--log-level", default=e("LOG_LEVEL", "info"))


async def run_agent(args: argparse.Namespace) -> int:
    from agent.config import AgentConfig
    from agent.runner import AgentRuntime
    from ground.auth.secrets_files import cluster_keys
    from ground.registry.factory import open_registry

    config = AgentConfig(
        state_dir=args.state_dir.resolve(), cluster_keys=cluster_keys(args.cluster_key_file),
        egress=egress_policy(args), advertise_url=args.advertise_url,
        region=args.region, host=args.host, port=args.port,
        cpus=args.cpus, memory_mb=args.memory_mb, worker_id=args.id,
        cache_budget_bytes=args.cache_budget_mb << 20, heartbeat_interval_s=args.heartbeat_s,
        driver=args.driver, runtime=args.runtime, machine_cidr=args.machine_cidr,
        machine_pids_max=args.machine_pids_max, machine_egress=args.machine_egress,
        stop_machines_on_exit=args.stop_machines_on_exit, repair_log=args.repair,
    )
    if args.sweep:
        from agent.drivers import sweep

        await sweep(config)
        print(f"swept the machines of {config.state_dir}", flush=True)
        return 0
    from agent.runner import load_worker_id

    config.state_dir.mkdir(parents=True, exist_ok=True)
    worker = config.worker_id or load_worker_id(config.state_dir)
    runtime = AgentRuntime(config, open_registry(await registry_url(args, "agent", worker)))
    url = await runtime.start()
    driver = runtime.agent.driver if runtime.agent is not None else None
    what = "" if driver is None else f" (machines: {driver.name}" + (
        ")" if driver.isolated else ", NOT a security boundary between tenants)")
    print(f"thaw agent listening on {url}{what}", flush=True)
    await wait_for_signal()
    await runtime.stop()
    return 0


def add_store_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=env_default("STORE", "sqlite"), metavar="URL",
                   help="placement's durable store: sqlite (a file in the state dir) or "
                        "postgresql://USER@HOST:PORT/DB, which several placements share")
    p.add_argument("--store-password-file", type=Path, metavar="PATH",
                   default=optional_path(env_default("STORE_PASSWORD_FILE", "")),
                   help="the PostgreSQL user's password (a 0600 file; else in the URL)")


def store_url(args: argparse.Namespace) -> str:
    from placement.store.factory import with_password

    return with_password(args.store, args.store_password_file)


def placement_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = env_default
    p = sub.add_parser("placement", help="run the placement service (apps API, market, wake)")
    p.add_argument("--host", default=e("PLACEMENT_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(e("PLACEMENT_PORT", "4280")))
    p.add_argument("--tls-cert", default=e("PLACEMENT_TLS_CERT", ""),
                   help="PEM certificate chain: serve the API over HTTPS only")
    p.add_argument("--tls-key", default=e("PLACEMENT_TLS_KEY", ""),
                   help="the private key of --tls-cert")
    p.add_argument("--admin-host", default=e("PLACEMENT_ADMIN_HOST", "127.0.0.1"),
                   help="the admin listener's address (/metrics, /healthz, /readyz)")
    p.add_argument("--admin-port", type=int, default=int(e("PLACEMENT_ADMIN_PORT", "0")),
                   help="the admin listener's port (0: any free port)")
    p.add_argument("--advertise-url", default=e("PLACEMENT_ADVERTISE_URL", ""),
                   help="the URL edges reach this placement at, advertised in the registry "
                        "with the route key (default http(s)://HOST:PORT; none when HOST "
                        "is a wildcard)")
    p.add_argument("--state-dir", type=Path, default=Path(e("STATE_DIR", ".thaw/placement")))
    add_registry_flags(p)
    p.add_argument("--domain", default=e("DOMAIN", "localhost"),
                   help="apps are {app}.DOMAIN; no app may list a host under it")
    add_store_flag(p)
    p.add_argument("--store-pool-size", type=int,
                   default=int(e("STORE_POOL_SIZE", "32")), metavar="N",
                   help="connections to a PostgreSQL store; calls beyond wait for one")
    p.add_argument("--failed-mark-s", type=float, default=float(e("FAILED_MARK_S", "30")),
                   metavar="S",
                   help="a worker failed on edges' reports or a failed probe stays failed "
                        "this long unless its agent restarts (docs/failures.md)")
    p.add_argument("--admin-token-file", type=Path, default=None, metavar="PATH",
                   help="the bootstrap admin token (else $THAW_ADMIN_TOKEN)")
    p.add_argument("--secrets-key-file", type=Path, default=None, metavar="PATH",
                   help="keys that encrypt apps' secrets at rest, the newest first (0600; "
                        "without it secrets are refused); docs/security.md#secrets")
    add_cluster_key_flag(p)
    add_route_key_flag(p)
    add_egress_flags(p)
    p.add_argument("--log-level", default=e("LOG_LEVEL", "info"))


def edge_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = env_default
    p = sub.add_parser("edge", help="run the edge proxy")
    p.add_argument("--host", default=e("EDGE_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(e("EDGE_PORT", "8080")))
    p.add_argument("--admin-port", type=int, default=int(e("EDGE_ADMIN_PORT", "0")))
    p.add_argument("--placement", action="append", metavar="URL",
                   help="a placement's URL, for wakes; repeat it or separate several with "
                        "commas: a wake one does not answer goes to the next "
                        "(default $THAW_PLACEMENT_URL, else http://127.0.0.1:4280)")
    p.add_argument("--no-discover-placements", dest="discover_placements",
                   action="store_false",
                   help="ask only the --placement URLs, not those placements publish in the "
                        "registry (discovered ones are trusted only when sealed with the "
                        "route key)")
    p.add_argument("--no-direct-thaw", dest="direct_thaw", action="store_false",
                   help="leave a suspended machine's resume to placement's wake alone (by "
                        "default the edge also asks the machine's agent itself)")
    p.add_argument("--cacert", default=e("CACERT", ""), metavar="PATH",
                   help="the CA (PEM) an https --placement's certificate is checked against "
                        "(default $THAW_CACERT, else the system's CAs)")
    p.add_argument("--domain", default=e("DOMAIN", "localhost"))
    p.add_argument("--region", default=e("REGION", "local"))
    add_registry_flags(p)
    p.add_argument("--max-held-total", type=int, default=int(e("MAX_HELD_TOTAL", "10000")),
                   help="requests held across all apps; past it new ones get 503")
    p.add_argument("--underscore-headers", choices=["drop", "reject"],
                   default=e("UNDERSCORE_HEADERS", "drop"),
                   help="request header names with '_': dropped (default) or refused (400)")
    p.add_argument("--max-held-share", type=float, default=float(e("MAX_HELD_SHARE", "0.1")),
                   metavar="F", help="the share of --max-held-total one app may hold "
                                     "(beyond: 503 queue_full for that app only)")
    p.add_argument("--max-conns-per-client", type=int,
                   default=int(e("MAX_CONNS_PER_CLIENT", "1024")), metavar="N",
                   help="open connections per client address (beyond: 429 / GOAWAY, close)")
    p.add_argument("--new-conns-per-s", type=float, default=float(e("NEW_CONNS_PER_S", "500")),
                   metavar="R", help="new connections per client address per second")
    p.add_argument("--new-conns-burst", type=int, default=int(e("NEW_CONNS_BURST", "256")),
                   metavar="N", help="new connections a client may open at once before "
                                     "they are spread at --new-conns-per-s")
    p.add_argument("--h2-client-resets-per-s", type=float,
                   default=float(e("H2_CLIENT_RESETS_PER_S", "200")), metavar="R",
                   help="HTTP/2 stream resets per client address over all its connections")
    p.add_argument("--client-requests-per-turn", type=int,
                   default=int(e("CLIENT_REQUESTS_PER_TURN", "8")), metavar="N",
                   help="requests one client address may begin per turn of the event loop "
                        "(the rest wait for the next turn: a burst from one client does "
                        "not delay everyone else's)")
    p.add_argument("--max-held-per-client", type=int,
                   default=int(e("MAX_HELD_PER_CLIENT", "256")), metavar="N",
                   help="requests one client address may have held over all apps "
                        "(beyond: 429 too_many_held)")
    p.add_argument("--max-tunnels-per-client", type=int,
                   default=int(e("MAX_TUNNELS_PER_CLIENT", "64")), metavar="N",
                   help="WebSocket tunnels one client address may hold over all apps "
                        "(beyond: 429 too_many_tunnels)")
    p.add_argument("--nft-table", default=e("NFT_TABLE", ""), metavar="NAME",
                   help="drop barred clients and SYN floods (past twice --new-conns-per-s per "
                        "client) in the kernel: an nftables table NAME of this edge's own, "
                        "made at start, deleted at stop (needs nft and CAP_NET_ADMIN)")
    p.add_argument("--max-resends", type=int, default=int(e("MAX_RESENDS", "2")), metavar="N",
                   help="times a request is sent again after a machine closed its connection "
                        "without answering (beyond: 502; 0 never resends)")
    p.add_argument("--tunnel-share", type=float, default=float(e("TUNNEL_SHARE", "0.8")),
                   metavar="F", help="the share of a machine's hard_limit WebSocket tunnels "
                                     "may hold (beyond: 503 tunnels_full)")
    p.add_argument("--trusted-proxies", default=e("TRUSTED_PROXIES", ""), metavar="CIDR,...",
                   help="proxies in front of the edge, believed about the client "
                        "(X-Forwarded-For); default none: every peer is the client")
    p.add_argument("--tls-cert", default=e("TLS_CERT", ""),
                   help="PEM certificate chain: also serve HTTPS (h2 and HTTP/1.1 by ALPN)")
    p.add_argument("--tls-key", default=e("TLS_KEY", ""), help="the private key of --tls-cert")
    p.add_argument("--tls-cert-dir", default=e("TLS_CERT_DIR", ""),
                   help="certificates chosen by SNI: NAME.pem, or NAME.crt + NAME.key")
    p.add_argument("--tls-port", type=int, default=int(e("TLS_PORT", "8443")))
    p.add_argument("--hsts", type=int, default=int(e("HSTS", "0")), metavar="SECONDS",
                   help="Strict-Transport-Security max-age on answers over TLS (0: none)")
    p.add_argument("--tls-handshake-timeout", type=float, metavar="SECONDS",
                   default=float(e("TLS_HANDSHAKE_TIMEOUT", "10")),
                   help="a connection not through its TLS handshake by then is closed")
    p.add_argument("--tls-max-handshakes", type=int,
                   default=int(e("TLS_MAX_HANDSHAKES", "1000")),
                   help="TLS handshakes in progress at once; a connection past it is closed "
                        "at once")
    p.add_argument("--access-log", default=e("ACCESS_LOG", "off"), metavar="off|stdout|PATH",
                   help="JSON access log, one line per answer: off (default), stdout, or a "
                        "file (appended to; reopened when rotated)")
    p.add_argument("--access-log-sample", type=float,
                   default=float(e("ACCESS_LOG_SAMPLE", "1")), metavar="RATE",
                   help="share of warm non-5xx answers logged, 0..1 (cold and 5xx: all)")
    add_cluster_key_flag(p)
    add_route_key_flag(p)
    p.add_argument("--log-level", default=e("LOG_LEVEL", "info"))


def up_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = env_default
    p = sub.add_parser("up", help="the whole platform in one process")
    p.add_argument("--state-dir", type=Path, default=Path(e("STATE_DIR", ".thaw")))
    p.add_argument("--edge-port", type=int, default=int(e("EDGE_PORT", "8080")))
    p.add_argument("--api-port", type=int, default=int(e("API_PORT", "4280")))
    p.add_argument("--admin-port", type=int, default=int(e("EDGE_ADMIN_PORT", "0")))
    p.add_argument("--agents", type=int, default=int(e("AGENTS", "3")))
    p.add_argument("--domain", default=e("DOMAIN", "localhost"))
    add_store_flag(p)
    p.add_argument("--tls", action="store_true", default=e("TLS", "") == "1",
                   help="also serve HTTPS (h2 and HTTP/1.1) on --tls-port with certificates "
                        "from a local CA made in the state directory")
    p.add_argument("--tls-port", type=int, default=int(e("TLS_PORT", "8443")))
    add_driver_flags(p)
    p.add_argument("--hello-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a field of the example app (e.g. idle_timeout_s=2)")
    p.add_argument("--access-log", default=e("ACCESS_LOG", ""), metavar="off|stdout|PATH",
                   help="the edge's JSON access log (default: STATE_DIR/access.log)")
    p.add_argument("--access-log-sample", type=float,
                   default=float(e("ACCESS_LOG_SAMPLE", "0.01")), metavar="RATE",
                   help="share of warm non-5xx answers logged, 0..1 (default one in a "
                        "hundred; cold and 5xx: all)")
    add_egress_flags(p)
    p.add_argument("--log-level", default=e("LOG_LEVEL", "info"))


async def run_placement(args: argparse.Namespace) -> int:
    from ground.auth.secrets_files import admin_token, cluster_keys, route_keys, secret_keys
    from ground.registry.factory import open_registry
    from placement.adapters.coordination import open_coordination
    from placement.config import PlacementConfig
    from placement.runner import PlacementRuntime

    config = PlacementConfig(
        state_dir=args.state_dir.resolve(), cluster_keys=cluster_keys(args.cluster_key_file),
        admin_token=admin_token(args.admin_token_file), domain=args.domain,
        secret_keys=secret_keys(args.secrets_key_file),
        egress=egress_policy(args), host=args.host, port=args.port, store=store_url(args),
        tls_cert=args.tls_cert, tls_key=args.tls_key, admin_host=args.admin_host,
        admin_port=args.admin_port, route_keys=route_keys(args.route_key_file),
        advertise_url=args.advertise_url, store_pool_size=args.store_pool_size,
        failed_mark_s=args.failed_mark_s,
    )
    registry = await registry_url(args, "placement")
    runtime = PlacementRuntime(config, open_registry(registry),
                               coordination=open_coordination(registry))
    url = await runtime.start()
    print(f"thaw placement listening on {url} (admin {args.admin_host}:{runtime.admin_port})",
          flush=True)
    await wait_for_signal()
    await runtime.stop()
    return 0


async def run_edge(args: argparse.Namespace) -> int:
    from edge.adapters.loadboard import open_load_board
    from edge.config import EdgeConfig, TlsConfig
    from edge.runner import EdgeRuntime
    from ground.auth.secrets_files import cluster_keys, route_keys
    from ground.registry.factory import open_registry

    tls = None
    if args.tls_cert or args.tls_key or args.tls_cert_dir:
        tls = TlsConfig(cert=args.tls_cert or "", key=args.tls_key or "",
                        cert_dir=args.tls_cert_dir or "", port=args.tls_port,
                        hsts_max_age_s=args.hsts,
                        handshake_timeout_s=args.tls_handshake_timeout,
                        max_handshakes=args.tls_max_handshakes)
    placements = ",".join(args.placement or [env_default("PLACEMENT_URL",
                                                          "http://127.0.0.1:4280")])
    config = EdgeConfig(placement_url=placements, placement_cafile=args.cacert,
                        discover_placements=args.discover_placements,
                        direct_thaw=args.direct_thaw,
                        domain=args.domain, host=args.host,
                        port=args.port, admin_port=args.admin_port, region=args.region,
                        max_held_total=args.max_held_total, max_held_share=args.max_held_share,
                        max_conns_per_client=args.max_conns_per_client,
                        tunnel_share=args.tunnel_share,
                        new_conns_per_s=args.new_conns_per_s,
                        new_conns_burst=args.new_conns_burst,
                        h2_client_resets_per_s=args.h2_client_resets_per_s,
                        client_requests_per_turn=args.client_requests_per_turn,
                        max_held_per_client=args.max_held_per_client,
                        max_tunnels_per_client=args.max_tunnels_per_client,
                        max_resends=args.max_resends,
                        underscore_headers=args.underscore_headers,
                        trusted_proxies=tuple(c for c in args.trusted_proxies.split(",")
                                              if c.strip()),
                        nft_table=args.nft_table,
                        cluster_keys=cluster_keys(args.cluster_key_file), tls=tls,
                        access_log="" if args.access_log == "off" else args.access_log,
                        access_log_sample_rate=args.access_log_sample,
                        route_keys=route_keys(args.route_key_file))
    registry = await registry_url(args, "edge")
    runtime = EdgeRuntime(config, open_registry(registry), board=open_load_board(registry))
    await runtime.start()
    from ground.native import state as native_state

    on, why = native_state()
    tls_note = f", TLS :{runtime.tls_port}" if tls is not None else ""
    print(f"thaw edge listening on {args.host}:{runtime.proxy_port}{tls_note} "
          f"(admin :{runtime.admin_port}; native {'on' if on else 'off'}: {why})", flush=True)
    await wait_for_signal()
    await runtime.stop()
    return 0


def up_config(args: argparse.Namespace) -> UpConfig:
    from thaw.cmdbase import settings
    from thaw.up import UpConfig

    return UpConfig(
        state_dir=args.state_dir, edge_port=args.edge_port, api_port=args.api_port,
        admin_port=args.admin_port, agents=args.agents, domain=args.domain,
        hello_overrides=tuple(settings(args.hello_set).items()),
        allow_registries=tuple(args.allow_registry),
        only_allowed_registries=args.only_allowed_registries,
        allow_layouts=tuple(str(Path(d).resolve()) for d in args.allow_layout),
        tls=args.tls, tls_port=args.tls_port,
        access_log=args.access_log, access_log_sample_rate=args.access_log_sample,
        store=store_url(args), driver=args.driver, runtime=args.runtime,
    )


async def run_up(args: argparse.Namespace) -> int:
    from thaw.up import Platform

    platform = Platform(up_config(args))
    try:
        await platform.start()
        written = platform.write_context()  # before the banner says to use it
        print(platform.banner(), flush=True)
        print(written, flush=True)
        await wait_for_signal()
    finally:
        await platform.stop()
    return 0


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


SERVICES = {"up": run_up, "edge": run_edge, "placement": run_placement, "agent": run_agent}


class Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for a mistyped command or choice, and a description
    for every sub-command (its help line, when it has none of its own)."""

    def error(self, message: str) -> NoReturn:
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            close = difflib.get_close_matches(wrong.group(1), choices, n=1)
            if close:
                message += f"; did you mean '{close[0]}'?"
        super().error(message)


# help lines of flags and arguments many commands share, by (command, name) or by name
HELP = {
    "state_dir": "where this service keeps its durable state",
    "log_level": "debug, info, warning or error",
    "domain": "apps are served as NAME.DOMAIN",
    "region": "the region this service runs in",
    "host": "the address to listen on",
    "admin_port": "the edge's admin port (metrics, state; 0: any free port)",
    "tls_port": "the HTTPS port (with TLS)",
    ("up", "edge_port"): "the edge's port (HTTP/1.1 and h2c)",
    ("up", "api_port"): "placement's API port",
    ("up", "agents"): "how many worker agents to run",
    ("edge", "port"): "the proxy's port (HTTP/1.1 and h2c)",
    ("placement", "port"): "the API's port",
    ("agent", "port"): "the agent's port (0: any free port)",
    ("agent", "cpus"): "CPUs this worker offers to machines",
    ("agent", "memory_mb"): "memory this worker offers to machines, MiB",
    ("agent", "cache_budget_mb"): "the image layer cache's bound, MiB",
    ("agent", "heartbeat_s"): "seconds between heartbeats to the registry",
    "driver": "what runs machines: auto (OCI containers as root, else bubblewrap), oci, "
              "bubblewrap or process",
    "runtime": "the OCI runtime binary (runc, crun, runsc or a path)",
    ("agent", "machine_cidr"): "the OCI driver's machine addresses (a /31 per machine)",
    ("agent", "machine_pids_max"): "processes per machine (OCI driver)",
    ("agent", "machine_egress"): "what machines may open outside: public addresses through "
                                 "NAT, or none (never the host, other machines or private "
                                 "ranges)",
    ("agent", "stop_machines_on_exit"): "stop this worker's machines when it exits",
    "name": "the app's name",
    "app": "the app's name",
    "id": "the id (see the list command)",
    "set": "an AppConfig field, e.g. --set concurrency.soft_limit=20 (repeatable)",
    "config": "the app's thaw.toml (default ./thaw.toml)",
    "image": "the image to run instead of thaw.toml's",
    "version": "the release to roll back to",
}


def _describe(parser: argparse.ArgumentParser, command: str = "") -> None:
    """Every sub-command gets its help line as its description, and every flag and
    argument without a help line gets HELP's."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                if not child.description:
                    child.description = helps.get(name)
                _describe(child, command or name)
        elif not action.help:
            action.help = HELP.get((command, action.dest)) or HELP.get(action.dest)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="thaw", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"thaw {version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of failures")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser,
                                metavar="COMMAND")
    up_parser(sub)
    edge_parser(sub)
    placement_parser(sub)
    agent_parser(sub)
    cmd_registry.add(sub)
    sub.add_parser("image", help="build OCI images: thaw image build DIR -t NAME:TAG ...")
    add_client_commands(sub, env_default)
    loadtest_parser(sub).set_defaults(run=run_loadtest)
    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=["bash", "zsh", "fish"],
                            help="the shell to complete for")
    _describe(parser)
    return parser


def version() -> str:
    try:
        return importlib.metadata.version("thaw")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line, unless --debug
        if debug:
            raise
        command = next((a for a in argv if not a.startswith("-")), "")
        print(f"thaw {command}: {exc}".replace("thaw : ", "thaw: "), file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    if argv[:1] == ["image"]:
        from thaw.imagebuild import image_main

        return image_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "completion":
        from thaw.completion import SHELLS

        print(SHELLS[args.shell](parser), end="")
        return 0
    setup_logging(getattr(args, "log_level", "info"))
    service = SERVICES.get(args.command)
    if service is None:
        return run_client_command(args)
    import uvloop

    from ground.errors import ServiceError

    try:
        return uvloop.run(service(args))
    except (ValueError, OSError, ServiceError) as exc:
        print(f"thaw {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
