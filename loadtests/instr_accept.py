"""The edge's instructions per connection, for callgrind: N connections, one after the
other, from a client process of their own to an edge in this process
(tests/support/edge_fakes.py's warm edge, a backend process of its own), each either
refused for its client's limits (`refused`: over its new connections, 429 and close) or
served one GET with `Connection: close` (`served`).

    for mode in refused served; do for n in 500 2500; do PYTHONHASHSEED=0 valgrind \\
        --tool=callgrind --callgrind-out-file=/tmp/cga.$mode.$n \\
        .venv/bin/python loadtests/instr_accept.py $mode $n 2>&1 | grep Collected; done; done

The difference of the two counts of a mode divided by 2,000 is what one connection costs
the edge (start-up and imports cancel out; the edge's idle work over the longer run —
timers, no Redis — is included). Only this process is instrumented: the client and the
backend are not counted.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.edge_fakes import start_warm_edge

CLIENT = """
import socket, sys
port, n, request = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
for _ in range(n):
    sock = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
    answer = b""
    try:  # a refused connection is closed with the request unread: a reset may come first
        sock.sendall(request)
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        answer = answer or b"reset"
    if not answer.startswith((b"HTTP/1.1 200", b"HTTP/1.1 429", b"reset")):
        raise SystemExit(f"unexpected answer: {answer[:80]!r}")
    sock.close()
"""


async def main(mode: str, connections: int) -> None:
    limits: dict[str, object] = (
        {"new_conns_per_s": 0.001, "new_conns_burst": 1} if mode == "refused"
        else {"new_conns_per_s": 1e6, "new_conns_burst": 1_000_000})
    request = "GET / HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n\r\n"
    async with await start_warm_edge(**limits) as edge:
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, str(edge.port), str(connections), request)
        if await client.wait() != 0:
            raise SystemExit("the client failed")
        refused = sum(edge.shell.clients.refused.values())
        print(f"{mode}: {connections} connections, {refused} refused", file=sys.stderr)


if __name__ == "__main__":
    import uvloop

    if len(sys.argv) != 3 or sys.argv[1] not in ("refused", "served"):
        raise SystemExit(__doc__)
    uvloop.run(main(sys.argv[1], int(sys.argv[2])))
