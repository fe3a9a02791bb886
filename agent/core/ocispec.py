"""A machine's OCI runtime configuration (config.json, runtime spec 1.0).

Decides what a container is allowed: its own user, mount, pid, ipc, uts, network and
cgroup namespaces (no IPv6 yet); root inside mapped to an
unprivileged range outside; Podman's default capabilities (Docker's minus NET_RAW, MKNOD
and AUDIT_WRITE), and none at all for a non-root user; no_new_privs; the seccomp profile
it is given; Docker's masked and read-only /proc and /sys paths; only the standard
devices; and the limits the market reserved (memory = swap limit, cpu quota, pids).
Invariants: the same inputs give the same document (a prepared container is reused only
while its config is unchanged); nothing of the host's filesystem is mounted except the
files named in `etc_files` (read-only). It must not know about files, processes or time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OCI_VERSION = "1.0.2"
CPU_PERIOD_US = 100_000
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
    "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID",
    "CAP_SYS_CHROOT",
)
# Docker's defaults (moby oci/defaults.go): kernel interfaces a container has no business
# reading (masked: an empty file or dir over them) or changing (read-only).
MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
    "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
    "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
)
READONLY_PATHS = (
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
)
# (type, major, minor): null, zero, full, random, urandom, tty, ptmx, and the pts.
ALLOWED_DEVICES = (
    ("c", 1, 3), ("c", 1, 5), ("c", 1, 7), ("c", 1, 8), ("c", 1, 9), ("c", 5, 0),
    ("c", 5, 2), ("c", 136, -1),
)
# cgroup: the machine sees its own cgroup as `/`, not the host's paths
NAMESPACES = ("pid", "ipc", "uts", "mount", "user", "network", "cgroup")


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpus: float
    pids: int
    swap_accounted: bool = True  # the host can limit memory+swap (cgroup v1 memsw)


@dataclass(frozen=True)
class Identity:
    """The process's user inside the container."""

    uid: int = 0
    gid: int = 0
    additional_gids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ContainerSpec:
    hostname: str
    argv: tuple[str, ...]
    env: tuple[str, ...]  # "NAME=value"
    cwd: str
    user: Identity
    rootfs: str  # the merged tree (absolute)
    uid_base: int  # host id of the container's 0; the range is `uid_size` long
    limits: Limits
    cgroups_path: str
    etc_files: tuple[tuple[str, str], ...] = ()  # (path inside, file outside), read-only
    seccomp: dict[str, Any] | None = None
    uid_size: int = 65536
    nofile: int = 65536
    sysctls: tuple[tuple[str, str], ...] = field(default=(
        ("net.ipv4.ip_unprivileged_port_start", "0"),  # Docker's: any user binds its port
        ("net.ipv4.ping_group_range", "0 65535"),  # every id of the machine's range
        # no IPv6 until machines get addresses of it: a link-local address would reach
        # the host end of the link past any IPv4 rule
        ("net.ipv6.conf.all.disable_ipv6", "1"),
        ("net.ipv6.conf.default.disable_ipv6", "1"),
    ))


def runtime_config(spec: ContainerSpec) -> dict[str, Any]:
    """The config.json of the container."""
    linux: dict[str, Any] = {
        "namespaces": [{"type": kind} for kind in NAMESPACES],
        "uidMappings": [{"containerID": 0, "hostID": spec.uid_base, "size": spec.uid_size}],
        "gidMappings": [{"containerID": 0, "hostID": spec.uid_base, "size": spec.uid_size}],
        "resources": _resources(spec.limits),
        "cgroupsPath": spec.cgroups_path,
        "maskedPaths": list(MASKED_PATHS),
        "readonlyPaths": list(READONLY_PATHS),
        "sysctl": dict(spec.sysctls),
    }
    if spec.seccomp is not None:
        linux["seccomp"] = spec.seccomp
    return {
        "ociVersion": OCI_VERSION,
        "process": _process(spec),
        "root": {"path": spec.rootfs, "readonly": False},
        "hostname": spec.hostname,
        "mounts": _mounts(spec),
        "linux": linux,
    }


def capabilities(user: Identity) -> dict[str, list[str]]:
    """Root gets the default set; any other user has them only as a bound (none in
    effect, so a setuid binary cannot raise them either: no_new_privs)."""
    caps = list(DEFAULT_CAPABILITIES)
    held = caps if user.uid == 0 else []
    return {"bounding": caps, "effective": held, "permitted": held, "inheritable": [],
            "ambient": []}


def _process(spec: ContainerSpec) -> dict[str, Any]:
    user: dict[str, Any] = {"uid": spec.user.uid, "gid": spec.user.gid}
    if spec.user.additional_gids:
        user["additionalGids"] = list(spec.user.additional_gids)
    return {
        "terminal": False,
        "user": user,
        "args": list(spec.argv),
        "env": list(spec.env),
        "cwd": spec.cwd or "/",
        "capabilities": capabilities(spec.user),
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": spec.nofile, "soft": spec.nofile}],
        "noNewPrivileges": True,
    }


def _resources(limits: Limits) -> dict[str, Any]:
    memory: dict[str, Any] = {"limit": limits.memory_bytes}
    if limits.swap_accounted:
        memory["swap"] = limits.memory_bytes  # memory + swap: no swap beyond the memory
    devices: list[dict[str, Any]] = [{"allow": False, "access": "rwm"}]
    for kind, major, minor in ALLOWED_DEVICES:
        devices.append({"allow": True, "type": kind, "major": major, "minor": minor,
                        "access": "rwm"})
    return {
        "memory": memory,
        "cpu": {"quota": max(1000, round(limits.cpus * CPU_PERIOD_US)),
                "period": CPU_PERIOD_US},
        "pids": {"limit": limits.pids},
        "devices": devices,
    }


def _mounts(spec: ContainerSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    for inside, outside in spec.etc_files:
        mounts.append({"destination": inside, "type": "bind", "source": outside,
                       "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]})
    return mounts
