"""HTTP client of the agents' internal API. Foreign exceptions stop here.

Every call is signed with the cluster key (thaw/auth) and returns `(status, JSON
body)`; a transport failure or timeout becomes `AgentUnreachable`, whose message
names the call but not the worker's address (it may reach an app owner): the
address and the cause go to the log.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import msgspec
import yarl

from placement.errors import PlacementError
from thaw.auth.aiohttp_glue import Signer

log = logging.getLogger("thaw.placement")


class AgentUnreachable(PlacementError):
    status = 502
    code = "worker_unreachable"


class AgentClient:
    def __init__(self, timeout_s: float, signer: Signer) -> None:
        self.timeout_s = timeout_s
        self.signer = signer
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, force_close=False)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self,
        method: str,
        url: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, Any]:
        data = msgspec.json.encode(body) if body is not None else b""
        target = yarl.URL(url + path)
        if params:
            target = target.with_query(params)
        headers = self.signer.headers(method, target, data)
        if data:
            headers["Content-Type"] = "application/json"
        limit = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._http().request(
                method, yarl.URL(str(target), encoded=True), data=data or None,
                headers=headers, timeout=limit,
            ) as response:
                raw = await response.read()
                return response.status, decode(raw)
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
