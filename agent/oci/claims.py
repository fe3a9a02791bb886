"""Host-wide claims on numbered slots (user-id ranges, machine addresses).

Several agents share a host (`thaw up` runs three; tests run more), and two machines
must never be given the same user-id range or address. A slot is claimed by a file
`<dir>/<slot>` naming its owner (the machine's directory), written under an exclusive
lock on the directory, so every agent on the host sees one owner per slot. A claim whose
owner directory no longer exists is stale (its agent's state was removed, or the machine
was destroyed before its claim was let go) and is taken over. The first slot tried is
derived from the owner, which spreads machines over the pool.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path


class NoSlot(Exception):
    """Every slot of the pool is claimed by a live owner."""


class Claims:
    def __init__(self, directory: Path, slots: int, first: int = 1) -> None:
        """Slots `first` .. `slots - 1` of a pool kept under `directory`."""
        if not 0 <= first < slots:
            raise ValueError(f"no slot in [{first}, {slots})")
        self.directory = directory
        self.slots = slots
        self.first = first

    def claim(self, owner: Path, wanted: int | None = None) -> int:
        """A slot for `owner`: `wanted` (its recorded slot) if that is free or already
        its own, else the first free one on its probe path. NoSlot if none is left."""
        with self._locked():
            for slot in self._probe(owner, wanted):
                holder = self._owner(slot)
                if holder == str(owner):
                    return slot
                if holder is None or not Path(holder).is_dir():
                    self._write(slot, owner)
                    return slot
        raise NoSlot(f"all {self.slots - self.first} slots under {self.directory} are "
                     "claimed")

    def _probe(self, owner: Path, wanted: int | None) -> Iterator[int]:
        """`wanted` (when in the pool), then every slot from the one `owner` hashes to:
        made as tried (the id pool has ~65,000 slots; the first free one is near)."""
        if wanted is not None and self.first <= wanted < self.slots:
            yield wanted
        span = self.slots - self.first
        start = int.from_bytes(hashlib.sha256(str(owner).encode()).digest()[:8], "big") % span
        for step in range(span):
            yield self.first + (start + step) % span

    def release(self, slot: int, owner: Path) -> None:
        with self._locked():
            if self._owner(slot) == str(owner):
                (self.directory / str(slot)).unlink(missing_ok=True)

    def prune(self) -> int:
        """Let go of every claim whose owner dir no longer exists; how many."""
        if not self.directory.is_dir():
            return 0
        pruned = 0
        with self._locked():
            for path in self.directory.iterdir():
                if not path.name.isdigit():
                    continue
                holder = self._owner(int(path.name))
                if holder is not None and not Path(holder).is_dir():
                    path.unlink(missing_ok=True)
                    pruned += 1
        return pruned

    def owner(self, slot: int) -> str | None:
        return self._owner(slot)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _owner(self, slot: int) -> str | None:
        try:
            return (self.directory / str(slot)).read_text()
        except FileNotFoundError:
            return None

    def _write(self, slot: int, owner: Path) -> None:
        path = self.directory / str(slot)
        tmp = path.with_name(f".{slot}.tmp")
        tmp.write_text(str(owner))
        tmp.replace(path)
