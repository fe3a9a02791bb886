"""Client of placement's internal API (aiohttp): wake an app, ask to auto-stop a machine.

Foreign exceptions are translated here: every failure is an EdgeError whose
code is one of placement's WAKE_ERRORS codes, or `wake_failed`.
"""

from __future__ import annotations

import aiohttp
import msgspec

from edge.errors import EdgeError
from placement.api import WAKE_ERRORS, AutostopRequest, WakeRequest, WakeResponse


class PlacementClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, force_close=False)
            )
        return self._session

    async def wake(self, app: str, request: WakeRequest, timeout_s: float) -> WakeResponse:
        url = f"{self.base_url}/internal/apps/{app}/wake"
        try:
            async with self._client().post(
                url, data=msgspec.json.encode(request),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                body = await response.read()
                if response.status == 200:
                    return msgspec.json.decode(body, type=WakeResponse)
                raise _error_from(response.status, body)
        except TimeoutError:
            message = f"placement did not answer within {timeout_s:.1f}s"
            raise EdgeError("deadline", message) from None
        except aiohttp.ClientError as exc:
            raise EdgeError("wake_failed", f"placement unreachable: {exc}") from None
        except msgspec.DecodeError as exc:
            raise EdgeError("wake_failed", f"placement sent a bad wake answer: {exc}") from None

    async def autostop(self, app: str, machine_id: str, request: AutostopRequest) -> bool:
        """True: placement stopped/suspended it; False: placement kept it (409)."""
        url = f"{self.base_url}/internal/apps/{app}/machines/{machine_id}/autostop"
        try:
            async with self._client().post(
                url, data=msgspec.json.encode(request),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=30),
            ) as response:
                body = await response.read()
                if response.status == 200:
                    return True
                if response.status == 409:
                    return False
                raise _error_from(response.status, body)
        except TimeoutError:
            raise EdgeError("wake_failed", "placement did not answer an autostop") from None
        except aiohttp.ClientError as exc:
            raise EdgeError("wake_failed", f"placement unreachable: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _error_from(status: int, body: bytes) -> EdgeError:
    try:
        decoded = msgspec.json.decode(body)
        code = str(decoded.get("error", ""))
        message = str(decoded.get("message", ""))
    except (msgspec.DecodeError, AttributeError):
        code, message = "", body[:200].decode("utf-8", "replace")
    if code not in WAKE_ERRORS:
        code = "deadline" if status == 504 else "wake_failed"
    return EdgeError(code, message or f"placement answered {status}")
