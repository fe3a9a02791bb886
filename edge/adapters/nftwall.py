"""The edge's wall in the kernel carried out with the distribution's `nft` (the ruleset
and what it drops: edge/core/kernelwall.py).

`install` makes the edge's table (it fails the edge's start when `nft` refuses: the
operator asked for the wall); `bar` queues an address and one task writes what is queued
in one `nft -f -` batch, so a storm of strikes costs a few processes, off the loop;
`remove` deletes the table when the edge stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Iterable, Sequence

from edge.core import kernelwall
from edge.core.forwarding import Network
from edge.core.kernelwall import NotAnAddress
from ground import spawn

log = logging.getLogger("thaw.edge")
NFT = "nft"
NFT_TIMEOUT_S = 10.0


class WallError(OSError):
    pass


class NftWall:
    def __init__(self, table: str) -> None:
        self.table = kernelwall.check_table(table)
        self._queued: dict[str, float] = {}  # address -> longest bar asked (seconds)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.barred = 0  # addresses handed to the kernel
        self.failed = 0  # batches nft refused

    async def install(self, ports: Sequence[int], conns_per_s: float, conns_burst: int,
                      trusted: Iterable[Network]) -> None:
        if shutil.which(NFT) is None:
            raise WallError("--nft-table: `nft` (nftables) is not installed "
                            "(apt-get install nftables)")
        script = kernelwall.ruleset(self.table, ports, conns_per_s, conns_burst, trusted)
        await _nft(script)
        self._task = asyncio.create_task(self._write_bars())
        log.info("nftables: table %s %s drops barred clients and SYN floods to ports %s",
                 kernelwall.FAMILY, self.table, ", ".join(str(p) for p in ports))

    def bar(self, peer: str, seconds: float) -> None:
        """Drop `peer`'s packets to the edge for `seconds` (soon: written by a task)."""
        try:
            address = str(kernelwall.packet_address(peer))
        except NotAnAddress:
            return  # a Unix socket's peer: nothing to drop
        self._queued[address] = max(seconds, self._queued.get(address, 0.0))
        self._wake.set()

    async def _write_bars(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            queued, self._queued = self._queued, {}
            script = "".join(kernelwall.bar(self.table, address, seconds)
                             for address, seconds in queued.items())
            try:
                await _nft(script)
                self.barred += len(queued)
            except WallError as exc:  # the edge still refuses them itself
                self.failed += 1
                log.warning("nftables: could not bar %d address(es): %s", len(queued), exc)

    async def remove(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await _nft(kernelwall.delete(self.table))
        except WallError as exc:
            log.warning("nftables: table %s not deleted: %s", self.table, exc)


async def _nft(script: str) -> None:
    try:
        done = await spawn.run([NFT, "-f", "-"], input=script.encode(), keep_out=False,
                               timeout_s=NFT_TIMEOUT_S)
    except TimeoutError:
        raise WallError(f"nft did not answer within {NFT_TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        raise WallError(f"nft: {done.err.decode(errors='replace').strip()[:500]}")
