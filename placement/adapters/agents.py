"""HTTP client of the agents' internal API. Foreign exceptions stop here.

Every call is signed with the cluster key (thaw/auth) and returns `(status, JSON
body)`; a transport failure or timeout becomes `AgentUnreachable`, whose message
names the call but not the worker's address (it may reach an app owner): the
address and the cause go to the log. Long polls (an owner's wait on a machine)
have connections of their own, so they never hold those offers and starts need.

A call made while `fenced_by(token)` is in force (the reconciler's actions, under the
app's reconcile lease) carries `?fence=TOKEN`, signed with the URL: the agent refuses
it (409 `stale_fence`) once it has seen a newer token for the app, so a placement
whose lease passed to another while it was paused cannot act on the app's machines.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import aiohttp
import msgspec
import yarl

from placement.errors import PlacementError
from thaw.auth.aiohttp_glue import Signer

log = logging.getLogger("thaw.placement")
# The fencing token of the lease the calls made in this context act under (None: none).
_fence: ContextVar[int | None] = ContextVar("fence", default=None)


@contextlib.contextmanager
def fenced_by(token: int) -> Iterator[None]:
    """Calls that change machines, made in this context (and tasks made in it), carry
    `token` for the agent to check."""
    previous = _fence.set(token)
    try:
        yield
    finally:
        _fence.reset(previous)


class AgentUnreachable(PlacementError):
    status = 502
    code = "worker_unreachable"


class AgentClient:
    def __init__(self, timeout_s: float, signer: Signer, connections: int = 256) -> None:
        self.timeout_s = timeout_s
        self.signer = signer
        self.connections = connections
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    def _http(self, long_poll: bool) -> aiohttp.ClientSession:
        session = self._sessions.get(long_poll)
        if session is None:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections, force_close=False))
            self._sessions[long_poll] = session
        return session

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()

    async def call(self, method: str, url: str, path: str, body: Any = None,
                   **options: Any) -> tuple[int, Any]:
        """The answer's status and JSON body (`options` as `read` takes them)."""
        status, _, raw = await self.read(method, url, path, body, **options)
        return status, decode(raw)

    async def read(
        self,
        method: str,
        url: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
        long_poll: bool = False,
    ) -> tuple[int, dict[str, str], bytes]:
        """The answer as it came: status, headers and body (a log is not JSON)."""
        data = msgspec.json.encode(body) if body is not None else b""
        fence = _fence.get()
        if fence is not None and method != "GET":
            params = {**(params or {}), "fence": str(fence)}
        target = yarl.URL(url + path)
        if params:
            target = target.with_query(params)
        signed_url, headers = self.signer.signed(method, target, data)
        limit = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._http(long_poll).request(
                method, signed_url, data=data or None, headers=headers, timeout=limit,
            ) as response:
                return response.status, dict(response.headers), await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("agent call %s %s%s failed: %r", method, url, path, exc)
            raise AgentUnreachable(f"a worker did not answer {method} {path}") from None


def decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return {"error": "agent_error", "message": "the worker sent an answer that is not JSON"}
