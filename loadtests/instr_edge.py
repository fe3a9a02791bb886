"""The edge's instructions per proxied request, for callgrind: N requests through
micro_edge.py's edge pair (in-memory transports, one connection), nothing else.

    for n in 1000 6000; do PYTHONHASHSEED=0 valgrind --tool=callgrind \\
        --callgrind-out-file=/tmp/cg.$n .venv/bin/python loadtests/instr_edge.py $n \\
        2>&1 | grep Collected; done

(the difference of the two counts divided by 5,000 is the cost of one request, start-up
and imports cancelled out; callgrind counts the same whatever the machine's load).

    .venv/bin/python loadtests/instr_edge.py N [SAMPLE]

With SAMPLE, the access log is on (to /dev/null, its writer thread counted too) with
that share of warm answers logged: 0.01 is `thaw up`'s default, 1 every answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests import micro_edge


async def main(requests: int, sample: float | None) -> None:
    config: dict[str, object] = {}
    if sample is not None:
        config = {"access_log": "/dev/null", "access_log_sample_rate": sample}
    pair = await micro_edge.edge_pair(**config)
    micro_edge.run(pair, requests)
    access_log = pair[0].shell.access_log
    if access_log is not None:
        await access_log.close()  # every line kept is written, inside the count


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else None))
