"""The edge's instructions per proxied request, for callgrind: N requests through
micro_edge.py's edge pair (in-memory transports, one connection), nothing else.

    for n in 1000 6000; do PYTHONHASHSEED=0 valgrind --tool=callgrind \\
        --callgrind-out-file=/tmp/cg.$n .venv/bin/python loadtests/instr_edge.py $n \\
        2>&1 | grep Collected; done

(the difference of the two counts divided by 5,000 is the cost of one request, start-up
and imports cancelled out; callgrind counts the same whatever the machine's load).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests import micro_edge


async def main(requests: int) -> None:
    micro_edge.run(await micro_edge.edge_pair(), requests)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(int(sys.argv[1])))
