"""CPU seconds for 4,000 h2c GETs (10 streams in flight on one connection) through an edge
in this process (client and edge both counted: compare trees, not absolute figures).

    PYTHONPATH=TREE THAW_NATIVE=0 taskset -c 0 .venv/bin/python loadtests/micro_h2.py

Run it alternately for two checkouts and compare medians (issue 26's deferred dispatch of
HTTP/2 requests was judged so). The machine is tests/support/edge_fakes.py's backend.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from tests.support.edge_fakes import start_warm_edge
from tests.support.h2client import H2Client


async def main() -> None:
    edge = await start_warm_edge()
    try:
        client = await H2Client.open(edge.port)
        for _ in range(200):  # warm-up
            await client.request(b"web.localhost")
        began = time.process_time()
        for _ in range(400):
            ids = [client.start(b"web.localhost") for _ in range(10)]
            for stream_id in ids:
                await asyncio.wait_for(client.answers[stream_id].done.wait(), 10)
                del client.answers[stream_id]
        print(json.dumps(time.process_time() - began))
        await client.close()
    finally:
        await edge.close()


if __name__ == "__main__":
    asyncio.run(main())
