"""The edge's wall in the kernel (`--nft-table`, edge/adapters/nftwall.py), with real
sockets and the host's nftables: a client the edge barred is dropped before the edge sees
it, a SYN flood is thinned, everyone else is served, and the table lives as long as its
edge. Root and `nft` are needed (as for the machines' own network)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from edge.adapters.nftwall import WallError
from tests.integration.test_edge_client_limits import GET, reset_storm, warm_requests
from tests.support.edge_fakes import start_warm_edge

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None,
                       reason="the kernel's wall needs root and nft"),
]


def table_name() -> str:
    return f"thaw_test_{os.getpid()}_{time.monotonic_ns() % 100000}"


def nft_list(*what: str) -> str:
    listed = subprocess.run(["nft", "list", *what], capture_output=True, text=True)
    return listed.stdout if listed.returncode == 0 else ""


async def connects(source: str, port: int, timeout_s: float) -> bool:
    """Whether a connection from `source` is made within `timeout_s` (a dropped SYN is not:
    the client's kernel sends it again after a second)."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), timeout_s)
    except TimeoutError:
        return False
    writer.close()
    return True


async def served(port: int, source: str, count: int) -> list[int]:
    """`count` GETs from `source` over one keep-alive connection, their statuses."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    statuses = []
    try:
        for _ in range(count):
            writer.write(GET)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            statuses.append(int(head.split(b" ", 2)[1]))
    finally:
        writer.close()
    return statuses


async def test_a_barred_client_is_dropped_by_the_kernel_and_others_are_served() -> None:
    table = table_name()
    async with await start_warm_edge(nft_table=table) as edge:
        assert f"tcp dport != {edge.port} accept" in nft_list("table", "inet", table)
        while (await reset_storm(edge.port, "127.0.0.3", 150))[1] is None:
            pass  # until the client's budget is spent and it is cut
        deadline = time.monotonic() + 5
        while "127.0.0.3" not in nft_list("set", "inet", table, "barred4"):
            assert time.monotonic() < deadline, nft_list("table", "inet", table)
            await asyncio.sleep(0.05)
        refused = edge.shell.clients.refused["barred"]
        assert not await connects("127.0.0.3", edge.port, 0.5)  # no SYN-ACK: dropped
        assert edge.shell.clients.refused["barred"] == refused  # the edge never saw it
        assert await warm_requests(edge.port, 50) == [200] * 50
        assert await connects("127.0.0.4", edge.port, 2)  # another client, not barred
    assert nft_list("table", "inet", table) == ""  # the edge took its table with it


async def test_a_syn_flood_past_twice_the_clients_rate_is_thinned_in_the_kernel() -> None:
    table = table_name()
    async with await start_warm_edge(nft_table=table, new_conns_per_s=5,
                                     new_conns_burst=5) as edge:
        made = await asyncio.gather(*(connects("127.0.0.5", edge.port, 0.5)
                                      for _ in range(60)))
        # the kernel lets its burst (2 x 5) and its rate through, and drops the rest
        assert 10 <= sum(made) <= 20, sum(made)
        assert "127.0.0.5" in nft_list("set", "inet", table, "syn4")
        assert await served(edge.port, "127.0.0.6", 20) == [200] * 20  # another client
    assert nft_list("table", "inet", table) == ""


async def test_an_edge_asked_for_a_wall_it_cannot_raise_does_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nft here
    with pytest.raises(WallError, match="nft"):
        await start_warm_edge(nft_table=table_name())

