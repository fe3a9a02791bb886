"""Debian packages to one root filesystem layer, the way distroless builds its images.

`closure` walks `apt-cache depends` (Depends and Pre-Depends only) from a few
packages, taking the first usable alternative of each group and leaving out the
packages a userland that runs one program does not need (`SKIPPED`: dpkg, perl,
debconf, awk, ...); `versions` pins each one; `download` fetches the .deb files
with `apt-get download`; `DebTree` merges their `dpkg-deb --fsys-tarfile`
contents into one deterministic tar with a merged /usr like bookworm's (/bin,
/sbin, /lib, /lib64 are symlinks into /usr; a package's paths under them are
moved there, and its symlinks re-aimed). Documentation, man pages, info,
locales and lintian overrides are dropped, and so are setuid/setgid bits: a
machine gets no privilege from its image (the image cache refuses them too).
"""

from __future__ import annotations

import io
import posixpath
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

# Not needed to run one program, and pulled in only by maintainer scripts we never run.
SKIPPED = frozenset({
    "debconf", "perl-base", "perl", "perl-modules-5.36", "dpkg", "debianutils",
    "install-info", "mailcap", "mime-support", "tar", "gawk", "mawk", "original-awk",
})
MERGED_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_DROPPED = ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/",
            "usr/share/lintian/", "usr/share/bug/", "usr/share/doc-base/")
_DEPENDS = ("Depends:", "PreDepends:")


class DebError(RuntimeError):
    """apt or dpkg-deb failed, or a package is not known to apt."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str

    @property
    def pinned(self) -> str:
        return f"{self.name}={self.version}"


def _run(argv: list[str], cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise DebError(f"{argv[0]} is missing: this needs a Debian host with apt") from None
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise DebError(f"{' '.join(argv[:3])} ... failed: {detail}")
    return done.stdout


def parse_depends(text: str) -> dict[str, list[list[str]]]:
    """`apt-cache depends` output -> package -> dependency groups (alternatives in order).

    A virtual package (`<awk>`) stands for the providers listed under it."""
    groups: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    open_group: list[str] = []
    for line in text.splitlines():
        if line and not line.startswith(" "):
            current = groups.setdefault(line.strip(), [])
            open_group = []
            continue
        stripped = line.strip()
        if current is None or not stripped:
            continue
        kind, _, name = stripped.lstrip("|").partition(" ")
        if kind in _DEPENDS:
            if not open_group:
                current.append(open_group)
            open_group.append(name)
            if not line.startswith(" |"):
                open_group = []
        elif not kind.endswith(":") and current and current[-1] and stripped:
            current[-1].append(stripped)  # a provider of the virtual package above it
    return groups


def pick(group: list[str], chosen: set[str]) -> str | None:
    """The alternative to install for one group, or None when satisfied or all skipped."""
    real = [n for n in group if not n.startswith("<")]
    if any(n in chosen for n in real):
        return None
    return next((n for n in real if n not in SKIPPED), None)


def closure(roots: list[str]) -> list[str]:
    """Every package `roots` need (Depends and Pre-Depends, recursively), sorted."""
    chosen: set[str] = set(roots)
    frontier = list(roots)
    while frontier:
        out = _run(["apt-cache", "depends", "--no-recommends", "--no-suggests",
                    "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
                    *frontier])
        frontier = []
        for _name, groups in sorted(parse_depends(out).items()):
            for group in groups:
                picked = pick(group, chosen)
                if picked is not None:
                    chosen.add(picked)
                    frontier.append(picked)
    return sorted(chosen)


def versions(names: list[str]) -> list[Package]:
    """The candidate version apt would install of each package."""
    out = _run(["apt-cache", "show", "--no-all-versions", *names])
    found: dict[str, str] = {}
    name = ""
    for line in out.splitlines():
        if line.startswith("Package: "):
            name = line.split(": ", 1)[1]
        elif line.startswith("Version: ") and name not in found:
            found[name] = line.split(": ", 1)[1]
    missing = [n for n in names if n not in found]
    if missing:
        raise DebError(f"apt knows no candidate for {', '.join(missing)} (apt-get update?)")
    return [Package(n, found[n]) for n in names]


def download(packages: list[Package], into: Path) -> list[Path]:
    """The .deb of each package, fetched into `into` unless already there."""
    into.mkdir(parents=True, exist_ok=True)
    missing = [p.pinned for p in packages if _deb_of(p, into) is None]
    if missing:
        _run(["apt-get", "download", "-q", *missing], cwd=into)
    found = {p: _deb_of(p, into) for p in packages}
    absent = [p.pinned for p, path in found.items() if path is None]
    if absent:
        raise DebError(f"apt-get download left no .deb of {', '.join(absent)}")
    return [path for path in found.values() if path is not None]


def _deb_of(package: Package, directory: Path) -> Path | None:
    """apt-get download's file (name_version_arch.deb, the epoch's colon as %3a)."""
    version = package.version.replace(":", "%3a")
    for arch in ("amd64", "all"):
        path = directory / f"{package.name}_{version}_{arch}.deb"
        if path.is_file():
            return path
    return None


def merged_path(path: str) -> str:
    """A package path under merged /usr: "bin/dash" -> "usr/bin/dash"."""
    head = path.split("/", 1)[0]
    return f"usr/{path}" if head in MERGED_DIRS else path


def aimed_link(path: str, target: str) -> str:
    """A symlink's target once both it and what it names may have moved under /usr."""
    if target.startswith("/"):
        return "/" + merged_path(posixpath.normpath(target).lstrip("/"))
    where = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if where.startswith(".."):
        return target
    return posixpath.relpath(merged_path(where), posixpath.dirname(merged_path(path)) or ".")


class DebTree:
    """The merged contents of several packages plus files of our own, as one tar."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}

    def add_deb(self, deb: Path) -> None:
        raw = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True,
                             check=False)
        if raw.returncode != 0:
            raise DebError(f"dpkg-deb --fsys-tarfile {deb.name}: {raw.stderr.decode()[-300:]}")
        with tarfile.open(fileobj=io.BytesIO(raw.stdout)) as archive:
            for member in archive:
                self._add_member(archive, member)

    def _add_member(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        path = _relative(member.name)
        if not path or path in MERGED_DIRS or (path + "/").startswith(_DROPPED):
            return
        info = _clean(member, merged_path(path))
        data: bytes | None = None
        if member.issym():
            info.linkname = aimed_link(path, member.linkname)
        elif member.islnk():  # a copy, so entry order never matters
            source = self._entries.get(merged_path(_relative(member.linkname)))
            if source is None or source[1] is None:
                raise DebError(f"hard link {member.name} to {member.linkname}: not a file")
            info.type, info.size, data = tarfile.REGTYPE, source[0].size, source[1]
        elif member.isfile():
            handle = archive.extractfile(member)
            data = handle.read() if handle is not None else b""
        elif not member.isdir():
            return  # devices and fifos: no package we use ships one
        if info.isdir() and info.name in self._entries:
            return
        self._entries[info.name] = (info, data)

    def add_dir(self, path: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        self._entries[path] = (_info(path, tarfile.DIRTYPE, mode, uid, gid), None)

    def ensure_dir(self, path: str) -> None:
        """A root-owned 0755 directory unless a package made it already."""
        if path not in self._entries:
            self.add_dir(path)

    def add_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        info = _info(path, tarfile.REGTYPE, mode, 0, 0)
        info.size = len(data)
        self._entries[path] = (info, data)

    def add_symlink(self, path: str, target: str) -> None:
        info = _info(path, tarfile.SYMTYPE, 0o777, 0, 0)
        info.linkname = target
        self._entries[path] = (info, None)

    def files(self, prefix: str, suffix: str) -> list[tuple[str, bytes]]:
        """(path, data) of the files under `prefix` whose names end in `suffix`, symlinks
        to a file of the tree included (Debian links sitecustomize.py into /etc)."""
        found = []
        for name in self._entries:
            if name.startswith(prefix) and name.endswith(suffix):
                data = self._file_data(name)
                if data is not None:
                    found.append((name, data))
        return found

    def _file_data(self, name: str, hops: int = 8) -> bytes | None:
        info, data = self._entries.get(name, (None, None))
        if info is not None and info.issym() and hops > 0:
            target = posixpath.normpath(posixpath.join(posixpath.dirname("/" + name),
                                                       info.linkname)).lstrip("/")
            return self._file_data(merged_path(target), hops - 1)
        return data if info is not None and info.isfile() else None

    def tar_bytes(self) -> bytes:
        """The uncompressed tar, entries sorted by path, parents first."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for name in sorted(self._entries, key=lambda n: n.split("/")):
                info, data = self._entries[name]
                archive.addfile(info, io.BytesIO(data) if data is not None else None)
        return buffer.getvalue()


def _relative(name: str) -> str:
    """A member name as a clean relative path: "./usr/bin/" -> "usr/bin", "./" -> ""."""
    path = posixpath.normpath("/" + name).lstrip("/")
    return path


def _clean(member: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    info = _info(name, member.type, member.mode & ~0o6000, member.uid, member.gid)
    info.mtime, info.size = int(member.mtime), member.size if member.isfile() else 0
    return info


def _info(name: str, kind: bytes, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = kind, mode, uid, gid
    info.uname = info.gname = ""
    info.mtime = 0
    return info
