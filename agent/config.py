"""Agent configuration: frozen, validated at start, units in names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.core.restart import RestartPolicy
from ground.auth.signing import NO_CLUSTER_KEY, KeyRing
from imagecache.core.egress import EgressPolicy

DRIVERS = ("auto", "oci", "bubblewrap", "process")
MACHINE_EGRESS = ("public", "none")


@dataclass(frozen=True)
class AgentConfig:
    state_dir: Path
    cluster_keys: KeyRing | None = None  # checks placement's calls; required
    egress: EgressPolicy = field(default_factory=EgressPolicy)  # where images may come from
    region: str = "local"
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port
    cpus: float = 4.0
    memory_mb: int = 4096
    worker_id: str = ""  # "": read from (or created in) the state dir
    advertise_url: str = ""  # "": http://host:port
    machine_host: str = "127.0.0.1"  # where machines listen and are reached
    cache_budget_bytes: int = 2 << 30
    heartbeat_interval_s: float = 1.0
    # a change to a passing state (starting, stopping, ...) waits this long for the next
    # one before it is published, so that a resume is one registry write (agent.publisher)
    publish_coalesce_s: float = 0.005
    supervise_interval_s: float = 0.1
    # auto: the OCI driver as root with the runtime installed, else bubblewrap when it
    # works, else a plain process; oci | bubblewrap | process: that one or refuse to start
    driver: str = "auto"
    runtime: str = "runc"  # the OCI runtime: runc, crun, runsc or a path
    machine_cidr: str = "10.213.0.0/16"  # the OCI driver's machine addresses (a /31 each)
    # host-wide, tmpfs: claims on user-id ranges and addresses, machines' mounted trees
    run_dir: Path = Path("/run/thaw")
    machine_pids_max: int = 1024  # processes per machine (OCI driver)
    # what machines may open outside: public (public addresses, through NAT) or none;
    # never the host, other machines or private ranges (agent.core.machinenet)
    machine_egress: str = "public"
    log_max_bytes: int = 1 << 20  # per machine; trimmed to half when exceeded
    log_rate_bytes_s: int = 1 << 20  # a machine's output taken in per second (it waits)
    compact_after_records: int = 10_000
    disk_reserve_bytes: int = 16 << 20  # after a failed append: room needed to take changes
    stop_machines_on_exit: bool = False  # machines outlive the agent by default
    repair_log: bool = False  # start from the valid prefix of a damaged op log (a copy kept)
    restart: RestartPolicy = field(default_factory=RestartPolicy)

    def __post_init__(self) -> None:
        if self.cluster_keys is None:
            raise ValueError(NO_CLUSTER_KEY)
        if self.cpus <= 0:
            raise ValueError("cpus must be > 0")
        if self.memory_mb <= 0:
            raise ValueError("memory_mb must be > 0")
        if not self.region:
            raise ValueError("region must not be empty")
        if self.heartbeat_interval_s <= 0:
            raise ValueError("heartbeat_interval_s must be > 0")
        if not 0 <= self.publish_coalesce_s <= 1:
            raise ValueError("publish_coalesce_s must be in [0, 1]")
        if self.driver not in DRIVERS:
            raise ValueError(f"driver must be one of {', '.join(DRIVERS)}")
        if not 16 <= self.machine_pids_max <= 4_194_304:
            raise ValueError("machine_pids_max must be in [16, 4194304]")
        if self.machine_egress not in MACHINE_EGRESS:
            raise ValueError(f"machine_egress must be one of {', '.join(MACHINE_EGRESS)}")
