"""Client of placement's internal API (aiohttp): wake an app, ask to auto-stop a machine.

Every call is signed with the cluster key (thaw/auth). Foreign exceptions are
translated here: every failure is an EdgeError whose code is one of placement's
WAKE_ERRORS codes, or `wake_failed`.

A wake asks for placement's streamed answer (placement/api.py WAKE_STREAM_TYPE): the
prediction line, when one comes before the answer, is handed to `on_prediction` at
once; a placement that answers plainly (an older one, or a wake that ended before it
predicted) is read as before.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec
import yarl

from edge.config import EdgeConfig
from edge.errors import EdgeError
from placement.api import (
    WAKE_ERRORS,
    WAKE_STREAM_TYPE,
    AutostopRequest,
    SuspectAnswer,
    SuspectReport,
    WakeAnswer,
    WakeLine,
    WakePrediction,
    WakeRequest,
    WakeResponse,
)
from thaw.auth.aiohttp_glue import Signer
from thaw.tlscontexts import client_context

SUSPECT_TIMEOUT_S = 5.0


class PlacementClient:
    def __init__(self, config: EdgeConfig) -> None:
        assert config.cluster_keys is not None  # checked by the config
        self.base_url = config.placement_url.rstrip("/")
        self.signer = Signer(config.cluster_keys)
        # https: placement's certificate verified, always (checked here, at start)
        self._tls: ssl.SSLContext | bool = client_context(config.placement_cafile) \
            if self.base_url.startswith("https://") else True
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, force_close=False, ssl=self._tls)
            )
        return self._session

    def _post(self, path: str, body: bytes, timeout_s: float, accept: str = "") -> Any:
        """The signed POST, as aiohttp's `async with` request context."""
        url, headers = self.signer.signed("POST", yarl.URL(self.base_url + path), body)
        if accept:
            headers = {**headers, "Accept": accept}
        return self._client().post(url, data=body, headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def wake(self, app: str, request: WakeRequest, timeout_s: float,
                   on_prediction: Callable[[WakePrediction], None] | None = None
                   ) -> WakeResponse:
        try:
            async with self._post(f"/internal/apps/{app}/wake", msgspec.json.encode(request),
                                  timeout_s, WAKE_STREAM_TYPE) as response:
                if response.status == 200 and response.content_type == WAKE_STREAM_TYPE:
                    return await _streamed(response, on_prediction)
                body = await response.read()
                if response.status == 200:
                    return msgspec.json.decode(body, type=WakeResponse)
                raise _error_from(response.status, body)
        except TimeoutError:
            message = f"placement did not answer within {timeout_s:.1f}s"
            raise EdgeError("deadline", message) from None
        except aiohttp.ClientError as exc:
            raise EdgeError("wake_failed", f"placement unreachable: {exc}") from None
        except (msgspec.DecodeError, ValueError) as exc:  # (ValueError: a line too long)
            raise EdgeError("wake_failed", f"placement sent a bad wake answer: {exc}") from None

    async def autostop(self, app: str, machine_id: str, request: AutostopRequest) -> bool:
        """True: placement stopped/suspended it; False: placement kept it (409)."""
        path = f"/internal/apps/{app}/machines/{machine_id}/autostop"
        try:
            async with self._post(path, msgspec.json.encode(request), 30) as response:
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

    async def suspect(self, worker: str, report: SuspectReport) -> SuspectAnswer:
        try:
            async with self._post(f"/internal/workers/{worker}/suspect",
                                  msgspec.json.encode(report), SUSPECT_TIMEOUT_S) as response:
                body = await response.read()
                if response.status == 200:
                    return msgspec.json.decode(body, type=SuspectAnswer)
                raise _error_from(response.status, body)
        except TimeoutError:
            raise EdgeError("wake_failed", "placement did not answer a report") from None
        except aiohttp.ClientError as exc:
            raise EdgeError("wake_failed", f"placement unreachable: {exc}") from None
        except msgspec.DecodeError as exc:
            raise EdgeError("wake_failed", f"placement sent a bad answer: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _streamed(response: aiohttp.ClientResponse,
                    on_prediction: Callable[[WakePrediction], None] | None) -> WakeResponse:
    """The prediction line (read alone: it is small), then the last line whole."""
    first = msgspec.json.decode(await response.content.readline(), type=WakeLine)
    if isinstance(first, WakePrediction):
        if on_prediction is not None:
            on_prediction(first)
        last = msgspec.json.decode(await response.content.read(), type=WakeLine)
    else:
        last = first
    if isinstance(last, WakeAnswer):
        return last.answer
    if isinstance(last, WakePrediction):
        raise EdgeError("wake_failed", "placement's wake stream ended without an answer")
    raise _error(last.status, last.error, last.message)


def _error_from(status: int, body: bytes) -> EdgeError:
    try:
        decoded = msgspec.json.decode(body)
        code = str(decoded.get("error", ""))
        message = str(decoded.get("message", ""))
    except (msgspec.DecodeError, AttributeError):
        code, message = "", body[:200].decode("utf-8", "replace")
    return _error(status, code, message)


def _error(status: int, code: str, message: str) -> EdgeError:
    if code not in WAKE_ERRORS:
        code = "deadline" if status == 504 else "wake_failed"
    return EdgeError(code, message or f"placement answered {status}")
