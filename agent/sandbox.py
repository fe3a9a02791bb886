"""The bubblewrap command line of a machine: the image's own tree as `/` (read-only),
a user namespace in which the app runs as the image's user with no capabilities, and its
own pid, ipc and uts namespaces (docs/process-driver.md). The network is the host's: a
bubblewrap sandbox cannot be given a link without root, so the app listens on $PORT."""

from __future__ import annotations

from pathlib import Path

# Mount points a sandbox needs; an image without one gets no such mount (bubblewrap
# would have to create it in the image's tree, which is shared and read-only).
_API_MOUNTS = (("--proc", "proc"), ("--dev", "dev"), ("--tmpfs", "tmp"))


def sandbox_argv(bwrap: str, rootfs: Path, rel_workdir: str, hostname: str, uid: int,
                 gid: int) -> list[str]:
    """The bwrap command line up to and including ``--``; the app's argv follows."""
    mounts: list[str] = []
    for option, name in _API_MOUNTS:
        if (rootfs / name).is_dir() and not (rootfs / name).is_symlink():
            mounts += [option, f"/{name}"]
    return [
        bwrap,
        *("--ro-bind", str(rootfs), "/"),
        *mounts,
        *("--unshare-user", "--uid", str(uid), "--gid", str(gid)),
        *("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", hostname[:64]),
        *("--cap-drop", "ALL"),
        *("--chdir", f"/{rel_workdir}"),
        "--",
    ]
