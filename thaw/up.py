"""`thaw up`: placement, N agents and the edge in one process and one event loop.

Each service listens on its own loopback port and they talk real HTTP to each
other — signed with a cluster key made on first start (`<state>/cluster.key`) —
and share the embedded (in-memory) registry. Nothing in the services knows it runs
this way beyond the registry it was handed. An admin token is made on first start
too (`<state>/admin.token`, mode 0600), which the CLI finds by itself, and the key
that encrypts apps' secrets at rest (`<state>/secrets.key`, mode 0600), and the route
key placement and the edge seal machines' routes with (`<state>/route.key`, 0600; the
agents never get it: ground/auth/tickets.py). The state dir
is 0700 and every file the platform writes in it 0600 (ground/statefiles.py). With
`--tls` the API is HTTPS only, its certificate from the local CA the edge uses too
(`<state>/tls/ca.pem`, which the CLI finds by itself as well).

For operators it writes two files in the state directory: `access.log` (the
edge's JSON access log, unless `--access-log` says otherwise) and
`prometheus-targets.json`, every service's /metrics address with a `service`
label in Prometheus' file_sd format (agents and the edge's and placement's admin
listeners are on ports chosen at start), which deploy/prometheus/prometheus.yml reads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from agent.config import AgentConfig
from agent.runner import AgentRuntime
from edge.config import EdgeConfig
from edge.runner import EdgeRuntime
from ground.auth.sealing import SecretKeys
from ground.auth.secrets_files import (
    ADMIN_TOKEN_FILE,
    CLUSTER_KEY_FILE,
    ROUTE_KEY_FILE,
    SECRETS_KEY_FILE,
    ensure_secret,
)
from ground.auth.signing import KeyRing
from ground.auth.tickets import RouteKeys
from ground.registry.memory import MemoryRegistry
from ground.statefiles import private_dir, write_private
from ground.tlscontexts import client_context
from imagecache.core.egress import EgressPolicy
from placement.config import PlacementConfig
from placement.runner import PlacementRuntime
from thaw.imagebuild import build_image

log = logging.getLogger("thaw.up")

ACCESS_LOG_FILE = "access.log"
TARGETS_FILE = "prometheus-targets.json"

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "hello"

HELLO_APP: dict[str, Any] = {
    "name": "hello",
    "min_machines_running": 0,
    "max_machines": 3,
    "concurrency": {"type": "requests", "soft_limit": 20, "hard_limit": 25},
    "auto_stop": "stop",
    "idle_timeout_s": 30,
    "health": {"path": "/healthz", "timeout_s": 10},
}


UNLIMITED_CLIENT = 1_000_000  # thaw up's per-client limits on the edge: none to speak of


@dataclass(frozen=True)
class UpConfig:
    state_dir: Path
    edge_port: int = 8080
    api_port: int = 4280
    admin_port: int = 0
    agents: int = 3
    domain: str = "localhost"
    agent_cpus: float = 4.0
    agent_memory_mb: int = 4096
    example: Path = EXAMPLE
    hello_overrides: tuple[tuple[str, Any], ...] = ()
    allow_registries: tuple[str, ...] = ()  # beyond public registries
    only_allowed_registries: bool = False
    allow_layouts: tuple[str, ...] = ()  # beyond <state>/images
    tls: bool = False  # the edge also HTTPS on tls_port, the API HTTPS only; certificates
    #                    from a local CA (thaw/localca.py)
    tls_port: int = 8443
    access_log: str = ""  # "": <state>/access.log; "off"; "stdout"; or a file path
    # warm answers below 500 logged: one in a hundred (cold ones and 5xx always are); a
    # platform serving thousands a second would write a line each (issue 28)
    access_log_sample_rate: float = 0.01
    store: str = "sqlite"  # placement's store: or postgresql://USER@HOST:PORT/DB
    driver: str = "auto"  # what runs machines (agent.drivers)
    runtime: str = "runc"  # the OCI driver's runtime


class Platform:
    def __init__(self, config: UpConfig) -> None:
        self.config = config
        self.registry = MemoryRegistry()
        self.agents: list[AgentRuntime] = []
        self.placement: PlacementRuntime | None = None
        self.edge: EdgeRuntime | None = None
        self.api_url = ""
        self.admin_token = ""
        self.ca: Any = None  # thaw.localca.LocalCA with --tls

    async def start(self) -> None:
        state = private_dir(self.config.state_dir.resolve())
        keys = KeyRing.parse(ensure_secret(state / CLUSTER_KEY_FILE))
        self.admin_token = ensure_secret(state / ADMIN_TOKEN_FILE)
        route_keys = RouteKeys.parse(ensure_secret(state / ROUTE_KEY_FILE))
        # Images come from the layouts `thaw up` builds (and those allowed), or registries.
        egress = EgressPolicy.build(
            self.config.allow_registries, listed_only=self.config.only_allowed_registries,
            layout_dirs=[str(state / "images"), *self.config.allow_layouts],
        )
        for i in range(self.config.agents):
            runtime = AgentRuntime(self._agent_config(state, i, keys, egress), self.registry)
            self.agents.append(runtime)
            await runtime.start()
        tls, api_cert, api_key = None, "", ""
        if self.config.tls:
            from edge.config import TlsConfig
            from thaw.localca import LocalCA

            self.ca = LocalCA(state / "tls", self.config.domain)
            tls = TlsConfig(port=self.config.tls_port, issuer=self.ca.issue)
            api_cert, api_key = map(str, self.ca.api_files())
        self.placement = PlacementRuntime(
            PlacementConfig(state_dir=state / "placement", port=self.config.api_port,
                            cluster_keys=keys, admin_token=self.admin_token,
                            secret_keys=SecretKeys.parse(ensure_secret(state / SECRETS_KEY_FILE)),
                            domain=self.config.domain, egress=egress,
                            store=self.config.store, tls_cert=api_cert, tls_key=api_key,
                            route_keys=route_keys),
            self.registry,
        )
        self.api_url = await self.placement.start()
        self.edge = EdgeRuntime(
            EdgeConfig(placement_url=self.api_url, placement_cafile=self.cafile,
                       domain=self.config.domain,
                       port=self.config.edge_port, admin_port=self.config.admin_port,
                       cluster_keys=keys, tls=tls, access_log=self.access_log_target(state),
                       access_log_sample_rate=self.config.access_log_sample_rate,
                       route_keys=route_keys,
                       # one host's platform: every client (curl, the load-test kit) is
                       # this host, one address; `thaw edge` keeps its per-client limits
                       max_conns_per_client=UNLIMITED_CLIENT,
                       new_conns_per_s=UNLIMITED_CLIENT, new_conns_burst=UNLIMITED_CLIENT,
                       client_requests_per_turn=UNLIMITED_CLIENT,
                       max_held_per_client=UNLIMITED_CLIENT,
                       max_tunnels_per_client=UNLIMITED_CLIENT),
            self.registry,
        )
        await self.edge.start()
        write_targets(state / TARGETS_FILE, self.targets())
        await self._ensure_hello(state)

    @property
    def cafile(self) -> str:
        """The local CA's certificate file with --tls, else ""."""
        return str(self.ca.cert_path) if self.ca is not None else ""

    def sample_note(self) -> str:
        rate = self.config.access_log_sample_rate
        if rate >= 1.0:
            return ""
        return f" (cold and 5xx answers all, the others {rate:.0%}: --access-log-sample 1 for all)"

    def access_log_target(self, state: Path) -> str:
        """The edge's access log: <state>/access.log unless told otherwise ("" is off)."""
        chosen = self.config.access_log
        if chosen == "off":
            return ""
        return chosen or str(state / ACCESS_LOG_FILE)

    def targets(self) -> list[dict[str, Any]]:
        """Every service's metrics address, as Prometheus file_sd target groups."""
        assert self.edge is not None and self.placement is not None
        placement = f"{self.placement.config.admin_host}:{self.placement.admin_port}"
        groups = [
            {"targets": [f"{self.edge.config.admin_host}:{self.edge.admin_port}"],
             "labels": {"service": "edge"}},
            {"targets": [placement], "labels": {"service": "placement"}},
        ]
        for agent in self.agents:
            worker = agent.agent.worker_id if agent.agent is not None else ""
            groups.append({"targets": [_host_port(agent.url)],
                           "labels": {"service": "agent", "worker": worker}})
        return groups

    def _agent_config(self, state: Path, index: int, keys: KeyRing, egress: EgressPolicy
                      ) -> AgentConfig:
        return AgentConfig(
            state_dir=state / f"agent-{index}", cluster_keys=keys, egress=egress,
            worker_id=f"local-{index}", region="local", cpus=self.config.agent_cpus,
            memory_mb=self.config.agent_memory_mb, stop_machines_on_exit=True,
            driver=self.config.driver, runtime=self.config.runtime,
        )

    async def _ensure_hello(self, state: Path) -> None:
        """Build examples/hello into a local OCI layout; create app `hello` if absent."""
        layout = state / "images" / "layout"
        await asyncio.to_thread(build_image, self.config.example, "hello:latest", layout=layout)
        body = {**HELLO_APP, "image": f"oci:{layout}:latest", **dict(self.config.hello_overrides)}
        auth = {"Authorization": f"Bearer {self.admin_token}"}
        connector = aiohttp.TCPConnector(ssl=client_context(self.cafile) if self.ca else True)
        async with aiohttp.ClientSession(headers=auth, connector=connector) as session:
            async with session.get(f"{self.api_url}/v1/apps/hello") as response:
                if response.status == 200:
                    return
            async with session.post(f"{self.api_url}/v1/apps", json=body) as response:
                if response.status not in (200, 201, 409):
                    raise RuntimeError(f"cannot create app hello: {await response.text()}")

    async def stop(self) -> None:
        if self.edge is not None:
            await self.edge.stop()
        if self.placement is not None:
            await self.placement.stop()
        await asyncio.gather(*(agent.stop() for agent in self.agents), return_exceptions=True)

    def machines_line(self) -> str:
        """What runs machines, and a warning when that is no boundary between tenants."""
        agent = self.agents[0].agent if self.agents else None
        if agent is None:
            return "no agents"
        if agent.driver.isolated:
            return (f"machines: OCI containers ({agent.driver.name}: own rootfs, user and "
                    "network namespaces, cgroup limits)")
        return (f"machines: {agent.driver.name} -- NOT a security boundary between tenants "
                "(run as root with runc installed for containers)")

    def write_context(self) -> str:
        """Write the CLI's context `local` (this platform's API, token file and CA) and
        make it current: `thaw` then finds this platform from any directory; what to say
        about it."""
        from thaw import contexts

        token_file = (self.config.state_dir / ADMIN_TOKEN_FILE).resolve()
        made = contexts.Context(api=self.api_url, token_file=str(token_file),
                                cacert=str(self.ca.cert_path.resolve()) if self.ca else "",
                                app_url=self.app_url(),
                                images=f"oci:{(self.config.state_dir / 'images').resolve()}"
                                       "/layout")
        try:
            contexts.put(contexts.LOCAL, made, use=True)
        except (OSError, contexts.ContextError) as exc:
            return f"the CLI's context was not written ({exc}): pass --api {self.api_url}"
        where = contexts.config_dir() / contexts.FILE
        on_path = shutil.which("thaw") == str(Path(sys.executable).parent / "thaw")
        path_hint = ("" if on_path else
                     f"\n  export PATH=\"{Path(sys.executable).parent}:$PATH\"   # thaw on "
                     "your PATH")
        return (f"the CLI's context \"local\" is current ({where}): `thaw status` works "
                f"from any directory{path_hint}")

    def app_url(self) -> str:
        """Where this platform serves an app ({app}: its name): the edge's HTTPS port with
        --tls, else its plain one, under the domain (*.localhost reaches this host in curl
        and browsers)."""
        assert self.edge is not None
        if self.ca:
            return f"https://{{app}}.{self.config.domain}:{self.edge.tls_port}/"
        return f"http://{{app}}.{self.config.domain}:{self.edge.proxy_port}/"

    def banner(self) -> str:
        from ground.native import state as native_state

        assert self.edge is not None and self.placement is not None
        port = self.edge.proxy_port
        native_on, native_why = native_state()
        token_file = self.config.state_dir / ADMIN_TOKEN_FILE
        access_log = self.access_log_target(self.config.state_dir)
        # with --tls: the API's certificate is the local CA's (the CLI finds it in ./.thaw)
        cacert = f"--cacert {self.ca.cert_path} " if self.ca else ""
        return "\n".join(
            [
                f"thaw is up (pid {os.getpid()}): edge :{port}, API {self.api_url}, "
                f"admin :{self.edge.admin_port} (edge), :{self.placement.admin_port} "
                f"(placement), {len(self.agents)} agents, "
                f"state in {self.config.state_dir}",
                f"native edge {'on' if native_on else 'off'} ({native_why})",
                self.machines_line(),
                "",
                f"  curl -H 'Host: hello.{self.config.domain}' http://127.0.0.1:{port}/",
                *([f"  curl --cacert {self.ca.cert_path} "
                   f"https://hello.{self.config.domain}:{self.edge.tls_port}/"
                   "   # HTTP/2 by ALPN; --http1.1 for HTTP/1.1"] if self.ca else []),
                "",
                "  thaw status      # from any directory: the context \"local\" (below)",
                "  thaw apps open hello   # its URL, "
                + self.app_url().replace("{app}", "hello"),
                f"  curl {cacert}-H \"Authorization: Bearer $(cat {token_file})\" "
                f"{self.api_url}/v1/apps",
                "",
                f"access log: {access_log or 'off'}"
                f"{self.sample_note() if access_log else ''}; Prometheus targets (file_sd): "
                f"{self.config.state_dir / TARGETS_FILE} (deploy/prometheus/prometheus.yml, "
                "docs/observability.md)",
                "Ctrl-C stops everything.",
            ]
        )


def _host_port(url: str) -> str:
    """host:port of an http://host:port URL."""
    return url.split("://", 1)[-1].rstrip("/")


def write_targets(path: Path, groups: list[dict[str, Any]]) -> None:
    """Replace `path` whole (Prometheus re-reads file_sd files when they change)."""
    write_private(path, (json.dumps(groups, indent=2) + "\n").encode())
