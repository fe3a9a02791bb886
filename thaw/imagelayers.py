"""Layers of an app's files: `COPY` from a build context into an image, as deterministic tars.

A layer's tar has its entries sorted (parents before children), mtime 0, owner
0:0 unless `--chown` said otherwise, and modes reduced to 0755 (directories and
anything executable) or 0644, so the same files always make the same diff_id.
Only the directory a copy lands in is written, not its ancestors: an unpacker
makes missing parents itself, and writing /tmp again as 0755 would undo the
base's 1777. Symlinks are copied as symlinks. What the context's
`.dockerignore` (or the thaw-image.toml build's fixed list) hides does not exist
for a copy.
"""

from __future__ import annotations

import glob
import io
import posixpath
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from thaw.dockerignore import IgnoreRule, is_ignored


class CopyError(ValueError):
    """A copy names something the context does not have, or cannot be laid out."""


@dataclass(frozen=True)
class Owner:
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class LayerEntry:
    path: str  # in the image, relative to its root ("app/app.py")
    source: Path | None  # None: a directory of our own
    owner: Owner = Owner()
    mode: int | None = None  # None: 0755 for directories and executables, else 0644


class BuildContext:
    """The directory a build copies from, minus what it hides."""

    def __init__(self, root: Path, rules: list[IgnoreRule],
                 hidden: Callable[[str], bool] = lambda _path: False) -> None:
        self.root = root
        self._rules = rules
        self._hidden = hidden

    def visible(self, rel: str) -> bool:
        return rel == "" or not (self._hidden(rel) or is_ignored(rel, self._rules))

    def sources(self, pattern: str) -> list[str]:
        """Context-relative paths `pattern` names ("" is the context itself)."""
        relative = posixpath.normpath(pattern.lstrip("/") or ".")
        if relative == ".." or relative.startswith("../"):
            raise CopyError(f"{pattern}: outside the build context")
        clean = "" if relative == "." else relative
        # a symlinked directory on the way could lead a read outside the context
        parent = (self.root / clean).parent.resolve()
        if clean and not parent.is_relative_to(self.root.resolve()):
            raise CopyError(f"{pattern}: outside the build context (through a symlink)")
        if any(char in clean for char in "*?["):
            found = sorted(Path(p).relative_to(self.root).as_posix()
                           for p in glob.glob(glob.escape(str(self.root)) + "/" + clean))
            found = [p for p in found if self.visible(p)]
        else:
            exists = (self.root / clean).exists() or (self.root / clean).is_symlink()
            found = [clean] if exists and self.visible(clean) else []
        if not found:
            raise CopyError(f"{pattern}: not found in the build context")
        return found

    def walk(self, rel: str) -> list[str]:
        """Everything visible under directory `rel`, sorted; a directory is listed when
        it is visible itself or holds something visible (a `!` rule can reach inside)."""
        listed: list[str] = []
        for path in sorted((self.root / rel).iterdir()):
            child = posixpath.join(rel, path.name) if rel else path.name
            inside = self.walk(child) if path.is_dir() and not path.is_symlink() else []
            if self.visible(child) or inside:
                listed.append(child)
            listed.extend(inside)
        return listed


def copy_entries(
    context: BuildContext,
    patterns: list[str],
    dest: str,
    *,
    owner: Owner = Owner(),
    mode: int | None = None,
) -> list[LayerEntry]:
    """Docker's COPY: a directory's contents go into `dest`; a file goes to `dest`, or
    into it when `dest` ends in "/" or several sources are copied."""
    sources = [s for pattern in patterns for s in context.sources(pattern)]
    into = dest.endswith("/")
    if len(sources) > 1 and not into:
        raise CopyError(f"copying {len(sources)} sources: the destination {dest} must end in /")
    target = posixpath.normpath(dest).lstrip("/")
    target = "" if target == "." else target
    entries: list[LayerEntry] = []
    for source in sources:
        path = context.root / source
        if path.is_dir() and not path.is_symlink():
            if target:
                entries.append(LayerEntry(target, None, owner, mode))
            for child in context.walk(source):
                rel = posixpath.relpath(child, source) if source else child
                entries.append(LayerEntry(_join(target, rel), context.root / child, owner, mode))
        else:
            name = _join(target, path.name) if into else target
            if not name:
                raise CopyError(f"{source}: a file cannot replace the image's root")
            entries.append(LayerEntry(name, path, owner, mode))
    return entries


def _join(directory: str, rel: str) -> str:
    return posixpath.join(directory, rel) if directory else rel


def directory_entry(path: str, owner: Owner = Owner()) -> LayerEntry:
    """A directory of the image (WORKDIR makes one) as a layer entry."""
    return LayerEntry(posixpath.normpath(path).lstrip("/"), None, owner)


def layer_tar(entries: list[LayerEntry]) -> bytes:
    """The uncompressed tar of `entries`; the layer's diff_id is its sha256. A later file
    replaces an earlier one; a directory made first (by WORKDIR) keeps its owner, as a
    copy into an existing directory leaves the directory alone."""
    chosen: dict[str, LayerEntry] = {}
    for entry in entries:
        earlier = chosen.get(entry.path)
        if entry.path in ("", ".") or (earlier is not None and earlier.source is None):
            continue
        chosen[entry.path] = entry
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(chosen, key=lambda p: p.split("/")):
            archive.addfile(*_tar_entry(chosen[path]))
    return buffer.getvalue()


def _tar_entry(entry: LayerEntry) -> tuple[tarfile.TarInfo, io.BytesIO | None]:
    info = tarfile.TarInfo(entry.path)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, entry.owner.uid, \
        entry.owner.gid, "", ""
    source = entry.source
    if source is not None and source.is_symlink():
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, str(source.readlink()), 0o777
        return info, None
    if source is None or source.is_dir():
        info.type = tarfile.DIRTYPE
        info.mode = entry.mode if entry.mode is not None else 0o755
        return info, None
    data = source.read_bytes()
    info.size = len(data)
    executable = source.stat().st_mode & 0o111
    info.mode = entry.mode if entry.mode is not None else (0o755 if executable else 0o644)
    return info, io.BytesIO(data)


def owner_of(spec: str, passwd: Callable[[], str], group: Callable[[], str]) -> Owner:
    """`--chown` as numbers: "1000", "1000:1000", "app", "app:app" (names from the image's
    /etc/passwd and /etc/group, read only when a name is used). As Docker documents it,
    a user without a group also gives the group id: the user's id."""
    user, _, group_name = spec.partition(":")
    uid = _id_of(user, passwd, "user")
    gid = _id_of(group_name, group, "group") if group_name else uid
    return Owner(uid, gid)


def _id_of(name: str, table: Callable[[], str], what: str) -> int:
    if name.isdigit():
        return int(name)
    for line in table().splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[0] == name and fields[2].isdigit():
            return int(fields[2])
    raise CopyError(f"--chown: no {what} {name!r} in the image")
