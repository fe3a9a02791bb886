"""What a machine has on the host before its container exists: its claims (a user-id
range and a /31 of the address pool, host-wide), its rootfs mounted under the host's run
dir, its /etc/hosts and /etc/hostname, and its OCI bundle's config.json; and the undoing
of all of it. Blocking IO: the driver calls `materialise` in a thread.

On disk: `<machine dir>/slots.json` (its claims, so they survive the agent),
`<machine dir>/upper|work` (its writes), `<machine dir>/bundle/config.json`;
`<run dir>/roots/<id>/rootfs` (the merged tree), `hosts`, `hostname`.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

from agent.core.imageuser import resolve_user
from agent.core.machinenet import Egress, resolv_conf
from agent.core.ocispec import (
    DEFAULT_CAPABILITIES,
    ContainerSpec,
    Identity,
    Limits,
    runtime_config,
)
from agent.core.seccomp import default_profile
from agent.driverport import LaunchSpec
from agent.oci import cgroups, netns
from agent.oci.claims import Claims
from agent.oci.mounts import IdRange, MachineRoot, mount_root, unmount_root, unwalkable_parent
from agent.oci.rootfiles import read_in_root
from agent.oci.runtime import RuntimeFailure
from ground.statefiles import private_dir, write_private
from imagecache.adapters.trees import remove_tree_quietly

ID_BASE = 1 << 31  # user-id ranges live in the upper half of the id space
ID_RANGE = 65536
ID_SLOTS = ((1 << 32) - ID_BASE) // ID_RANGE - 1
MAX_OPEN_FILES = 65536


class MachineFiles:
    """The host-side things of this agent's machines (see the module's docstring)."""

    def __init__(self, run_dir: Path, machine_cidr: str, pids_max: int,
                 egress: Egress = Egress.PUBLIC) -> None:
        """`run_dir`: host-wide, on tmpfs: the claims every agent of the host shares, and
        the machines' mounted trees (`roots/<machine id>`)."""
        self.roots_dir = run_dir / "roots"
        closed = unwalkable_parent(self.roots_dir)
        if closed is not None:
            raise RuntimeFailure(f"{closed} is closed to other users (no o+x): machines "
                                 f"could not reach their rootfs under {self.roots_dir}")
        self.pool = netns.Pool(machine_cidr)
        net_key = str(self.pool.network).replace("/", "_")
        self.addresses = Claims(run_dir / "claims" / f"net-{net_key}", self.pool.slots)
        self.id_ranges = Claims(run_dir / "claims" / "ids", ID_SLOTS)
        for claims in (self.addresses, self.id_ranges):
            claims.prune()  # what agents whose state is gone left behind
        self.pids_max = pids_max
        self.resolv_conf = resolv_conf(_host_resolv_conf(), egress)
        self.swap_accounted = cgroups.swap_accounted()
        self.seccomp = default_profile(frozenset(DEFAULT_CAPABILITIES))
        # A container cannot raise its hard limit above the one it is created under.
        self.nofile = min(MAX_OPEN_FILES, resource.getrlimit(resource.RLIMIT_NOFILE)[1])

    def materialise(self, spec: LaunchSpec) -> dict[str, Any]:
        """Claims, rootfs and files of the machine; returns its runtime config (BadUser
        if the image's user is unknown)."""
        slots = self._slots(spec.machine_dir)
        ids = IdRange(ID_BASE + slots["ids"] * ID_RANGE, ID_RANGE)
        root = self.root(spec.machine_id, spec.machine_dir)
        mount_root(root, spec.rootfs, ids)
        user = resolve_user(spec.user, read_in_root(spec.rootfs, "/etc/passwd") or "",
                            read_in_root(spec.rootfs, "/etc/group") or "")
        env = {"HOME": user.home, **spec.env, "HOSTNAME": spec.machine_id}
        link = self.link(spec.machine_id, spec.machine_dir)
        container = ContainerSpec(
            hostname=spec.machine_id,
            argv=tuple(spec.argv),
            env=tuple(f"{k}={v}" for k, v in env.items()),
            cwd=spec.workdir or "/",
            user=Identity(user.uid, user.gid, user.additional_gids),
            rootfs=str(root.merged),
            uid_base=ids.base,
            uid_size=ids.size,
            limits=Limits(memory_bytes=spec.memory_mb << 20, cpus=spec.cpus,
                          pids=self.pids_max, swap_accounted=self.swap_accounted),
            cgroups_path=f"thaw/{spec.machine_id}",
            etc_files=_write_etc(root.run, spec.machine_id, link.machine_ip,
                                  self.resolv_conf),
            seccomp=self.seccomp,
            nofile=self.nofile,
        )
        return runtime_config(container)

    def _slots(self, machine_dir: Path) -> dict[str, int]:
        """The machine's user-id range and address slots: claimed once, kept in its dir
        (claimed again, the same if still free, after a reboot emptied the claims)."""
        path = machine_dir / "slots.json"
        recorded: dict[str, int] = {}
        if path.exists():
            recorded = json.loads(path.read_text())
        slots = {
            "ids": self.id_ranges.claim(machine_dir, recorded.get("ids")),
            "net": self.addresses.claim(machine_dir, recorded.get("net")),
        }
        if slots != recorded:
            write_private(path, json.dumps(slots).encode())
        return slots

    def root(self, machine_id: str, machine_dir: Path) -> MachineRoot:
        return MachineRoot(machine_dir, self.roots_dir / machine_id)

    def link(self, machine_id: str, machine_dir: Path) -> netns.Link:
        slots = json.loads((machine_dir / "slots.json").read_text())
        return self.pool.link(machine_id, int(slots["net"]))

    def has_slots(self, machine_dir: Path) -> bool:
        return (machine_dir / "slots.json").exists()

    def unmount(self, machine_id: str, machine_dir: Path) -> None:
        """Unmount its rootfs and remove its run dir (mounted again by the next prepare)."""
        root = self.root(machine_id, machine_dir)
        unmount_root(root)
        remove_tree_quietly(root.run)

    def release(self, machine_id: str, machine_dir: Path) -> None:
        """Let go of its claims (it is destroyed)."""
        if self.has_slots(machine_dir):
            slots = json.loads((machine_dir / "slots.json").read_text())
            self.id_ranges.release(int(slots["ids"]), machine_dir)
            self.addresses.release(int(slots["net"]), machine_dir)


def machine_dirs(machines_dir: Path) -> list[Path]:
    """Machine dirs this driver made things for (their slots are claimed)."""
    if not machines_dir.is_dir():
        return []
    return [d for d in machines_dir.iterdir() if (d / "slots.json").exists()]


def same_config(bundle: Path, config: dict[str, Any]) -> bool:
    try:
        return bool(json.loads((bundle / "config.json").read_text()) == config)
    except (OSError, ValueError):
        return False


def write_config(bundle: Path, config: dict[str, Any]) -> None:
    """config.json holds the machine's environment, the app's secrets in it (runc reads
    them there): 0600 in a 0700 dir, as Docker keeps its containers' configs."""
    private_dir(bundle)
    write_private(bundle / "config.json", json.dumps(config, indent=1).encode())  # its env


def _host_resolv_conf() -> str:
    try:
        return Path("/etc/resolv.conf").read_text(errors="replace")
    except OSError:
        return ""


def _write_etc(run_dir: Path, machine_id: str, address: str, resolv: str
               ) -> tuple[tuple[str, str], ...]:
    """/etc/hosts, /etc/hostname and /etc/resolv.conf of the machine, bound read-only over
    the image's."""
    hosts = run_dir / "hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                     f"{address}\t{machine_id}\n")
    hostname = run_dir / "hostname"
    hostname.write_text(machine_id + "\n")
    resolver = run_dir / "resolv.conf"
    resolver.write_text(resolv)
    return (("/etc/hosts", str(hosts)), ("/etc/hostname", str(hostname)),
            ("/etc/resolv.conf", str(resolver)))
