#!/usr/bin/env bash
# Sample the edge under wrk load with py-spy (low overhead, real uvloop process).
#   bash loadtests/profile_edge_pyspy.sh [seconds]   -> /tmp/edge-profile.txt (self time by function)
#   PYSPY_ARGS=--native bash loadtests/profile_edge_pyspy.sh 8   (with C frames)
# Same topology as bench_warm.py: nginx backend + redis on core 1, edge on core 0, wrk on core 1.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
work=$(mktemp -d /tmp/thaw-prof-XXXX)
port() { .venv/bin/python -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
BP=$(port); RP=$(port); EP=$(port); AP=$(port)
cat > "$work/b.conf" <<CONF
worker_processes 1; daemon off; pid $work/b.pid; error_log $work/b.err;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000; server { listen 127.0.0.1:$BP; location / { return 200 "ok\n"; } } }
CONF
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
taskset -c 1 nginx -c "$work/b.conf" & pids+=($!)
taskset -c 1 redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null & pids+=($!)
sleep 0.5
.venv/bin/python - "$RP" "$BP" <<'PY'
import asyncio, sys, time
sys.path.insert(0, ".")
from loadtests.bench_warm import seed_registry
asyncio.run(seed_registry(f"redis://127.0.0.1:{sys.argv[1]}/0", int(sys.argv[2])))
PY
taskset -c 0 .venv/bin/thaw edge --registry "redis://127.0.0.1:$RP/0" --port "$EP" --admin-port "$AP" \
  --placement http://127.0.0.1:9 --log-level warning & pids+=($!)
edge=$!
sleep 1.5
taskset -c 1 wrk -t1 -c50 -d$((secs + 2))s -H 'Host: bench.localhost' "http://127.0.0.1:$EP/" > "$work/wrk.txt" &
wrkpid=$!
sleep 1
# PYSPY_ARGS=--native adds C frames (uvloop, the kernel boundary, the GC); py-spy must then
# pause the process to unwind it, so it cannot be --nonblocking.
mode=--nonblocking; [[ "${PYSPY_ARGS:-}" == *--native* ]] && mode=
.venv/bin/py-spy record --pid "$edge" --duration "$secs" --rate 500 ${PYSPY_ARGS:-} $mode --format raw --output "$work/raw.txt" >/dev/null 2>&1
wait $wrkpid
grep Requests/sec "$work/wrk.txt"
.venv/bin/python - "$work/raw.txt" > /tmp/edge-profile.txt <<'PY'
import collections, sys
own = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n); total += n
    own[stack.split(";")[-1]] += n
for frame, n in own.most_common(40):
    print(f"{100*n/total:5.1f}%  {frame}")
PY
head -40 /tmp/edge-profile.txt
