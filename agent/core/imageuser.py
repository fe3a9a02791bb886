"""Who a machine's process runs as: the image's `User` (or the app's override) resolved
against the image's own /etc/passwd and /etc/group, as Docker resolves it.

`""` is root; `name`, `uid`, `name:group`, `uid:gid` and mixes are accepted. A name must
exist in the image's passwd (group names in its group file); a numeric uid need not, and
then its group is 0, as with `docker run --user 1234`. Supplementary groups are the
groups that list the user by name. HOME comes from the passwd entry, "/" without one.
It must not know about files: the texts are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ID = 65535  # inside the machine's 65536-id range


class BadUser(ValueError):
    pass


@dataclass(frozen=True)
class ResolvedUser:
    uid: int
    gid: int
    additional_gids: tuple[int, ...]
    home: str


@dataclass(frozen=True)
class _Entry:
    name: str
    uid: int
    gid: int
    home: str


def resolve_user(user: str, passwd: str, group: str) -> ResolvedUser:
    """Resolve `user` ("" is root); BadUser naming what is wrong."""
    name, _, group_part = user.partition(":")
    entries = _passwd(passwd)
    groups = _groups(group)
    entry = _find_user(name or "0", entries)
    if entry is None:
        raise BadUser(f"user {name!r} is not in the image's /etc/passwd")
    gid = entry.gid
    if group_part:
        gid = _find_group(group_part, groups)
    extra = tuple(sorted({g for g_name, g, members in groups
                          if entry.name and entry.name in members and g != gid}))
    return ResolvedUser(uid=entry.uid, gid=gid, additional_gids=extra, home=entry.home)


def _find_user(name: str, entries: list[_Entry]) -> _Entry | None:
    if name.isdigit():
        uid = _bounded(name, "user")
        found = next((e for e in entries if e.uid == uid), None)
        return found or _Entry("", uid, 0, "/")
    return next((e for e in entries if e.name == name), None)


def _find_group(name: str, groups: list[tuple[str, int, frozenset[str]]]) -> int:
    if name.isdigit():
        return _bounded(name, "group")
    for g_name, gid, _ in groups:
        if g_name == name:
            return gid
    raise BadUser(f"group {name!r} is not in the image's /etc/group")


def _bounded(value: str, what: str) -> int:
    number = int(value)
    if number > MAX_ID:
        raise BadUser(f"{what} id {number} is outside the machine's ids (0..{MAX_ID})")
    return number


def _passwd(text: str) -> list[_Entry]:
    entries = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) < 7 or not fields[2].isdigit() or not fields[3].isdigit():
            continue
        entries.append(_Entry(fields[0], int(fields[2]), int(fields[3]), fields[5] or "/"))
    return entries


def _groups(text: str) -> list[tuple[str, int, frozenset[str]]]:
    groups = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) < 4 or not fields[2].isdigit():
            continue
        members = frozenset(m for m in fields[3].split(",") if m)
        groups.append((fields[0], int(fields[2]), members))
    return groups
