"""HTTP client of the agents' internal API, and the `Workers` port over it (`HttpWorkers`,
placement/ports/workers.py). Foreign exceptions stop here.

Every call is signed with the cluster key (ground/auth) and returns `(status, JSON
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
from typing import Any, TypeVar

import aiohttp
import msgspec
import yarl

from agent.api import (
    ErrorView,
    HealthView,
    MachineGone,
    MachineView,
    OfferRequest,
    PulledImage,
    PullRequest,
)
from ground.auth.aiohttp_glue import Signer
from placement.errors import PlacementError
from placement.ports.workers import LogChunk, Refused, Unreachable

T = TypeVar("T")

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


def current_fence() -> int | None:
    """The fencing token calls made here carry (`fenced_by`), None if none."""
    return _fence.get()


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
        fence = current_fence()
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


def _refused(status: int, raw: bytes) -> Refused:
    try:
        error = msgspec.json.decode(raw, type=ErrorView) if raw else ErrorView()
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return Refused(status, "agent_error", "the worker sent an answer that is not JSON")
    return Refused(status, error.error, error.message)


class HttpWorkers:
    """The `Workers` port (placement/ports/workers.py) over the agents' signed HTTP API: the
    only code that knows their paths and status codes."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client

    async def _raw(self, method: str, url: str, path: str, body: Any = None,
                   ok: tuple[int, ...] = (200,), **options: Any
                   ) -> tuple[dict[str, str], bytes] | Refused | Unreachable:
        """The answer's headers and body when its status is one of `ok`."""
        try:
            status, headers, raw = await self.client.read(method, url, path, body, **options)
        except AgentUnreachable as exc:
            return Unreachable(exc.message)
        return (headers, raw) if status in ok else _refused(status, raw)

    async def _ask(self, answer: type[T], method: str, url: str, path: str,
                   body: Any = None, ok: tuple[int, ...] = (200,), **options: Any
                   ) -> T | Refused | Unreachable:
        got = await self._raw(method, url, path, body, ok, **options)
        if not isinstance(got, tuple):
            return got
        try:
            return msgspec.json.decode(got[1], type=answer)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            log.warning("agent call %s %s%s: an answer that is not a %s", method, url, path,
                        answer.__name__)
            return Refused(502, "agent_error", "the worker sent an answer placement cannot read")

    async def offer(self, url: str, offer: OfferRequest
                    ) -> MachineView | Refused | Unreachable:
        return await self._ask(MachineView, "POST", url, "/v1/offers", offer, ok=(200, 201))

    async def start(self, url: str, machine_id: str, wait_s: float,
                    timeout_s: float | None = None) -> MachineView | Refused | Unreachable:
        return await self._ask(MachineView, "POST", url, f"/v1/machines/{machine_id}/start",
                               params={"wait_s": f"{min(wait_s, 300.0):.3f}"},
                               timeout_s=timeout_s)

    async def stop(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        return await self._ask(MachineView, "POST", url, f"/v1/machines/{machine_id}/stop")

    async def suspend(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        return await self._ask(MachineView, "POST", url, f"/v1/machines/{machine_id}/suspend")

    async def destroy(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        return await self._ask(MachineView, "DELETE", url, f"/v1/machines/{machine_id}",
                               ok=(200, 202))

    async def pull(self, url: str, ref: str, timeout_s: float
                   ) -> PulledImage | Refused | Unreachable:
        return await self._ask(PulledImage, "POST", url, "/v1/images/pull", PullRequest(ref),
                               timeout_s=timeout_s)

    async def machine(self, url: str, machine_id: str) -> MachineView | Refused | Unreachable:
        return await self._ask(MachineView, "GET", url, f"/v1/machines/{machine_id}")

    async def wait(self, url: str, machine_id: str, state: str, timeout_s: float
                   ) -> MachineView | MachineGone | Refused | Unreachable:
        path = f"/v1/machines/{machine_id}/wait"
        got = await self._raw("GET", url, path, params={"state": state,
                                                         "timeout_s": str(timeout_s)},
                              timeout_s=timeout_s + 5, long_poll=True)
        if not isinstance(got, tuple):
            return got
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            return msgspec.json.decode(got[1], type=MachineView)
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            return msgspec.json.decode(got[1], type=MachineGone)  # id and state: destroyed
        return Refused(502, "agent_error", "the worker sent an answer placement cannot read")

    async def logs(self, url: str, machine_id: str, offset: int, max_bytes: int
                   ) -> LogChunk | Refused | Unreachable:
        got = await self._raw("GET", url, f"/v1/machines/{machine_id}/logs",
                              params={"offset": str(offset), "tail_bytes": str(max_bytes)})
        if not isinstance(got, tuple):
            return got
        headers, raw = got
        start = headers.get("X-Log-Offset", "")
        return LogChunk(int(start) if start.isdigit() else 0, raw)

    async def machines(self, url: str, app: str) -> list[MachineView] | Refused | Unreachable:
        return await self._ask(list[MachineView], "GET", url, "/v1/machines",
                               params={"app": app})

    async def health(self, url: str, timeout_s: float) -> HealthView | Refused | Unreachable:
        return await self._ask(HealthView, "GET", url, "/healthz", ok=(200, 503),
                               timeout_s=timeout_s)
