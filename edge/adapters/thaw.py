"""The edge's own thaw of a suspended machine: one signed call to the agent that runs it.

A resume through placement is six or so registry round trips and a second HTTP hop
before the agent is even asked (docs/benchmarks.md, "Where a resume's time goes"),
for a machine that exists, is sized and is reserved on its worker already. So when a
held request's wake would resume a suspended machine (`AppEntry.to_thaw`: the one
placement would choose), the edge also asks that machine's agent itself —
`POST /v1/machines/{id}/start?wait_s=`, signed with the cluster key as placement's
calls are — and releases what it holds on the agent's answer. The wake waits for that
answer (edge/coldpath.py): when the thaw brought the one machine it asks for, it is
answered by it and placement is not called; otherwise it goes to placement, which finds
the machine starting or started and waits for it rather than starting another (the
agent's start with `wait_s` is idempotent). Anything that goes wrong here changes
nothing: the wake is the fallback, and its answer releases the requests.

Trust: the edge routes by the agent's answer only when it names the machine asked
for, on the worker its (sealed) record named, started, and carries a route seal that
verifies (`admit`: edge/routeguard.py) — what the same worker's registry record
would need. The agent's URL is that worker's heartbeat in the registry (read once,
kept; dropped after any call that did not thaw), taken only as `http(s)://host:port`;
redirects are not followed, and an answer is read only uncompressed and with a
Content-Length within `MAX_ANSWER_BYTES`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
import yarl

from agent.api import MachineView
from ground.auth.aiohttp_glue import Signer
from ground.auth.signing import KeyRing
from ground.registry import MachineRecord
from ground.registry.types import WorkerStatus, facts_of

log = logging.getLogger("thaw.edge.thaw")

MAX_ANSWER_BYTES = 1 << 20  # a machine's view is a few KB
MAX_WORKERS_KEPT = 10_000  # agent URLs remembered (cleared when full: re-read on use)
CONNECT_TIMEOUT_S = 1.0  # an agent that does not accept in this long: leave it to the wake

# results, counted (thaw_edge_direct_thaws_total{result})
THAWED = "thawed"  # answered started and sealed: its held requests released
NO_WORKER = "no_worker"  # the worker has no live heartbeat (or the registry is away)
UNREACHABLE = "unreachable"  # no answer in time
REFUSED = "refused"  # answered, but not started (4xx/5xx, or another state)
UNSEALED = "unsealed"  # an answer the edge may not route by (seal, id, worker)


def plain_base(url: str) -> bool:
    """`url` is `http(s)://host[:port]` and nothing more (no user, path, query)."""
    try:
        parsed = yarl.URL(url)
    except ValueError:
        return False
    return (parsed.scheme in ("http", "https") and bool(parsed.host) and not parsed.user
            and not parsed.password and parsed.path in ("", "/") and not parsed.query_string
            and not parsed.fragment)


class AgentThaw:
    def __init__(self, keys: KeyRing, worker: Callable[[str], Awaitable[WorkerStatus | None]],
                 admit: Callable[[str, MachineRecord], bool]) -> None:
        """`worker`: a worker's heartbeat by id (the registry's); `admit`: may the edge
        route by a record of an app (the route guard)."""
        self.signer = Signer(keys)
        self.worker = worker
        self.admit = admit
        self.urls: dict[str, str] = {}  # worker id -> its agent's URL
        self.results: Counter[str] = Counter()
        self.closed = False
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self.closed:
            raise RuntimeError("closed")  # a thaw after close() opens no new session
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(  # compressed: not read (Content-Length)
                connector=aiohttp.TCPConnector(limit=256, force_close=False),
                auto_decompress=False)
        return self._session

    async def close(self) -> None:
        self.closed = True
        if self._session is not None:
            await self._session.close()

    async def _url(self, worker: str) -> str:
        url = self.urls.get(worker)
        if url is not None:
            return url
        try:
            status = await self.worker(worker)
        except Exception as exc:  # the registry away: the wake goes on without this
            log.debug("worker %s not read: %r", worker, exc)
            return ""
        url = status.url.rstrip("/") if status is not None else ""
        if not plain_base(url):
            return ""
        if len(self.urls) >= MAX_WORKERS_KEPT:
            self.urls.clear()
        self.urls[worker] = url
        return url

    async def thaw(self, app: str, record: MachineRecord, wait_s: float) -> MachineView | None:
        """Start `record`'s machine through its agent and wait up to `wait_s` for it: its
        view once started (one the edge may route by), else None (counted by why)."""
        view = await self._start(record, wait_s)
        result = self._judge(app, record, view) if view is not None else ""
        if result:
            self.results[result] += 1
        if result != THAWED:
            self.urls.pop(record.worker, None)  # read its heartbeat again next time
            return None
        return view

    def _judge(self, app: str, record: MachineRecord, view: MachineView) -> str:
        """What an answer is: THAWED (the edge may route by it), UNSEALED or REFUSED."""
        if not (view.id == record.id and view.worker == record.worker
                and view.app_uid == record.app_uid):
            return UNSEALED
        if view.state != "started" or not view.address:
            return REFUSED  # (not started in time: the wake goes on)
        if not self.admit(app, MachineRecord(**facts_of(view), seal=view.seal)):
            return UNSEALED
        return THAWED

    async def _start(self, record: MachineRecord, wait_s: float) -> MachineView | None:
        base = await self._url(record.worker)
        if not base:
            self.results[NO_WORKER] += 1
            return None
        target = (yarl.URL(base) / "v1" / "machines" / record.id / "start").with_query(
            wait_s=f"{wait_s:.3f}")
        url, headers = self.signer.signed("POST", target, b"")
        timeout = aiohttp.ClientTimeout(total=wait_s + 1.0, sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with self._client().post(url, headers=headers, timeout=timeout,
                                           allow_redirects=False) as response:
                size = response.content_length
                if (response.status != 200 or size is None or size > MAX_ANSWER_BYTES
                        or response.headers.get("Content-Encoding", "identity") != "identity"):
                    self.results[REFUSED] += 1
                    return None
                raw = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, RuntimeError) as exc:
            self.results[UNREACHABLE] += 1
            log.debug("thaw of %s at %s: %r", record.id, base, exc)
            return None
        try:
            return msgspec.json.decode(raw, type=MachineView)
        except msgspec.DecodeError:
            self.results[REFUSED] += 1
            return None
