"""HTTP client of the agents' internal API. Foreign exceptions stop here.

Every call returns `(status, JSON body)`; a transport failure or timeout becomes
`AgentUnreachable`, so the service sees only values and its own errors.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec

from placement.errors import PlacementError


class AgentUnreachable(PlacementError):
    status = 502
    code = "worker_unreachable"


class AgentClient:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
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
        data = msgspec.json.encode(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        limit = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._http().request(
                method, url + path, data=data, headers=headers, params=params, timeout=limit
            ) as response:
                raw = await response.read()
                return response.status, decode(raw)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise AgentUnreachable(f"{method} {url}{path}: {exc!r}") from None


def decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return {"error": "agent_error", "message": raw.decode(errors="replace")[:500]}
