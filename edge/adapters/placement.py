"""Client of placement's internal API (aiohttp): wake an app, ask to auto-stop a machine.

Every call is signed with the cluster key (ground/auth). Foreign exceptions are
translated here: every failure is an EdgeError whose code is one of placement's
WAKE_ERRORS codes, or `wake_failed`.

A wake asks for placement's streamed answer (placement/api.py WAKE_STREAM_TYPE): the
prediction line, when one comes before the answer, is handed to `on_prediction` at
once; a placement that answers plainly (an older one, or a wake that ended before it
predicted) is read as before.

Several placements: each call goes to the first of edge/core/placementorder.py's order;
one that does not answer (refused, reset, timed out while time is left, or 503 with a code
that is not a wake's answer, e.g. not ready) is put last and the call is made again to the
next, within the same deadline. Only answers count: a wake placement did answer (e.g.
`no_capacity`) is not asked again elsewhere.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

import aiohttp
import msgspec
import yarl

from edge.config import EdgeConfig
from edge.core.placementorder import answered, parse_urls, try_order
from edge.errors import EdgeError
from ground.auth.aiohttp_glue import Signer
from ground.tlscontexts import client_context
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

SUSPECT_TIMEOUT_S = 5.0
AUTOSTOP_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 2.0  # a placement that does not accept in this long is skipped
LEAST_ATTEMPT_S = 0.05  # less left than this: the deadline, not another placement


class _NotAnswered(Exception):
    """This placement did not answer the call (the next one is asked)."""


class PlacementClient:
    def __init__(self, config: EdgeConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert config.cluster_keys is not None  # checked by the config
        self.given = config.placement_urls
        self.discovered: tuple[str, ...] = ()
        self.base_url = self.given[0]
        self.signer = Signer(config.cluster_keys)
        self.clock = clock
        self.last_ok = ""
        self.failed_at: dict[str, float] = {}
        self.cafile = config.placement_cafile
        # https: placement's certificate verified, always (checked here, at start)
        self._tls: ssl.SSLContext | None = client_context(self.cafile) \
            if any(u.startswith("https://") for u in self.given) else None
        self._session: aiohttp.ClientSession | None = None

    @property
    def urls(self) -> tuple[str, ...]:
        """Every placement this edge may ask: the given ones, then the discovered."""
        return self.given + tuple(u for u in self.discovered if u not in self.given)

    def set_discovered(self, urls: Iterable[str]) -> None:
        """The placements the registry lists now (edge/adapters/registry_feed.py)."""
        self.discovered = parse_urls(list(urls))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, force_close=False)
            )
        return self._session

    def _ssl(self, base: str) -> ssl.SSLContext | bool:
        if not base.startswith("https://"):
            return True
        if self._tls is None:
            self._tls = client_context(self.cafile)
        return self._tls

    @asynccontextmanager
    async def _call(self, path: str, body: bytes, timeout_s: float,
                    accept: str = "") -> AsyncIterator[aiohttp.ClientResponse]:
        """The signed POST to the first placement that answers, within `timeout_s`: a
        response whose status is not "this placement is unavailable"."""
        deadline = self.clock() + timeout_s
        failure = "no placement"
        for base in try_order(self.urls, self.last_ok, self.failed_at, self.clock()):
            left = deadline - self.clock()
            if left < LEAST_ATTEMPT_S:
                break
            url, headers = self.signer.signed("POST", yarl.URL(base + path), body)
            if accept:
                headers = {**headers, "Accept": accept}
            timeout = aiohttp.ClientTimeout(total=left, sock_connect=min(left,
                                                                         CONNECT_TIMEOUT_S))
            try:
                response = await self._client().post(url, data=body, headers=headers,
                                                     timeout=timeout, ssl=self._ssl(base))
                if response.status == 503 and not await _is_answer(response):
                    response.release()
                    raise _NotAnswered(f"{base} answered 503 unavailable")
            except (_NotAnswered, aiohttp.ClientError, TimeoutError) as exc:
                if deadline - self.clock() < LEAST_ATTEMPT_S:
                    raise TimeoutError from None  # the deadline, whoever was asked
                self.failed_at[base] = self.clock()
                failure = f"{base}: {exc!r}"
                continue
            self.last_ok = answered(self.failed_at, base)
            try:
                yield response
            finally:
                response.release()
            return
        if deadline - self.clock() < LEAST_ATTEMPT_S:
            raise TimeoutError
        raise _NotAnswered(failure)

    async def wake(self, app: str, request: WakeRequest, timeout_s: float,
                   on_prediction: Callable[[WakePrediction], None] | None = None
                   ) -> WakeResponse:
        try:
            async with self._call(f"/internal/apps/{app}/wake", msgspec.json.encode(request),
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
        except (aiohttp.ClientError, _NotAnswered) as exc:
            raise EdgeError("wake_failed", f"placement unreachable: {exc}") from None
        except (msgspec.DecodeError, ValueError) as exc:  # (ValueError: a line too long)
            raise EdgeError("wake_failed", f"placement sent a bad wake answer: {exc}") from None

    async def autostop(self, app: str, machine_id: str, request: AutostopRequest) -> bool:
        """True: placement stopped/suspended it; False: placement kept it (409)."""
        path = f"/internal/apps/{app}/machines/{machine_id}/autostop"
        try:
            async with self._call(path, msgspec.json.encode(request),
                                  AUTOSTOP_TIMEOUT_S) as response:
                body = await response.read()
                if response.status == 200:
                    return True
                if response.status == 409:
                    return False
                raise _error_from(response.status, body)
        except TimeoutError:
            raise EdgeError("wake_failed", "placement did not answer an autostop") from None
        except (aiohttp.ClientError, _NotAnswered) as exc:
            raise EdgeError("wake_failed", f"placement unreachable: {exc}") from None

    async def suspect(self, worker: str, report: SuspectReport) -> SuspectAnswer:
        try:
            async with self._call(f"/internal/workers/{worker}/suspect",
                                  msgspec.json.encode(report), SUSPECT_TIMEOUT_S) as response:
                body = await response.read()
                if response.status == 200:
                    return msgspec.json.decode(body, type=SuspectAnswer)
                raise _error_from(response.status, body)
        except TimeoutError:
            raise EdgeError("wake_failed", "placement did not answer a report") from None
        except (aiohttp.ClientError, _NotAnswered) as exc:
            raise EdgeError("wake_failed", f"placement unreachable: {exc}") from None
        except msgspec.DecodeError as exc:
            raise EdgeError("wake_failed", f"placement sent a bad answer: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _is_answer(response: aiohttp.ClientResponse) -> bool:
    """A 503 is an answer when its code is a wake's (no_capacity, start_failed); any other
    503 (not ready, its registry or store unreachable) means "ask another placement"."""
    if response.content_type == WAKE_STREAM_TYPE:
        return True
    try:
        code = msgspec.json.decode(await response.read()).get("error", "")
    except (msgspec.DecodeError, AttributeError, aiohttp.ClientError):
        return False
    return code in WAKE_ERRORS


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
