"""Instructions per h2c request through an edge in this process, for callgrind: N GETs,
10 streams in flight on one connection (micro_h2.py's load), after 200 to warm up.

    for n in 500 2500; do PYTHONHASHSEED=0 valgrind --tool=callgrind \\
        --callgrind-out-file=/tmp/cg.h2.$n .venv/bin/python loadtests/instr_h2.py $n \\
        2>&1 | grep Collected; done

The difference of the two counts divided by 2,000 is one request's cost, start-up and
imports cancelled out. The h2 client (the `h2` library, pure Python) is counted too, the
same in any tree: compare trees, not the absolute figure. The machine (the fake backend)
is a process of its own, not counted (callgrind does not follow children by default).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from tests.support.edge_fakes import start_warm_edge
from tests.support.h2client import H2Client


async def main(requests: int) -> None:
    edge = await start_warm_edge()
    try:
        client = await H2Client.open(edge.port)
        for _ in range(200):  # warm-up
            await client.request(b"web.localhost")
        for _ in range(requests // 10):
            ids = [client.start(b"web.localhost") for _ in range(10)]
            for stream_id in ids:
                await asyncio.wait_for(client.answers[stream_id].done.wait(), 10)
                del client.answers[stream_id]
        await client.close()
    finally:
        await edge.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
