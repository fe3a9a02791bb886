"""Placement's HTTP API (aiohttp): public `/v1`, internal `/internal`, health.

Routes come from the table in routes.py; authentication and authorisation happen in
authn.py's middleware before any handler runs. Errors become `{"error": code,
"message": text}` in one middleware; a body that fails validation is 422 naming
the field; a host name taken by another app is 409 `host_taken`, naming the
holder only to a caller who may see it. Metrics are not here: they are on the admin
listener (admin.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from ground.appconfig import InvalidConfig
from ground.appconfig import decoded as body_as
from ground.auth.tokens import Principal
from placement.adapters.authn import PRINCIPAL, Authenticator, auth_middleware, principal_of
from placement.adapters.routes import ROUTES
from placement.api import (
    WAKE_STREAM_TYPE,
    AutostopRequest,
    CreateMachineRequest,
    DeployRequest,
    ErrorBody,
    JsonObject,
    Readiness,
    RollbackRequest,
    SecretsRequest,
    SuspectReport,
    TokenRequest,
    WakeAnswer,
    WakeLine,
    WakePrediction,
    WakeRefusal,
    WakeRequest,
    WakeResponse,
)
from placement.core.logs import BadCursor
from placement.errors import BadRequest, NotFound, PlacementError
from placement.machinelogs import DEFAULT_TAIL, MAX_TAIL
from placement.metrics import PlacementMetrics
from placement.openapi import openapi_document
from placement.service import Placement
from placement.store import HostTaken
from placement.wakes.wakeparts import predictions_to

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")
log = logging.getLogger("thaw.placement")
MAX_WAIT_S = 300.0
MAX_BODY_BYTES = 1 << 20


def json_response(value: object, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), status=status,
                        content_type="application/json", headers=headers)


def error_body(exc: PlacementError, principal: Principal | None) -> ErrorBody:
    if isinstance(exc, HostTaken) and principal is not None and principal.may_act_on(
            exc.holder):
        return ErrorBody(exc.code, f"host {exc.host} is held by app {exc.holder}",
                         holder=exc.holder)
    return ErrorBody(exc.code, exc.message)


def errors_middleware(metrics: PlacementMetrics) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except PlacementError as exc:
            headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
            response = json_response(error_body(exc, request.get(PRINCIPAL)), exc.status,
                                     headers)
        except InvalidConfig as exc:
            response = json_response(ErrorBody("invalid_config", exc.reason, field=exc.field),
                                     422)
        except web.HTTPException as exc:  # aiohttp's own 404/405/413: JSON like the rest
            code = exc.reason.lower().replace(" ", "_")
            response = json_response(ErrorBody(code, exc.reason), exc.status)
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            response = json_response(ErrorBody("internal", "internal error"), 500)
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        metrics.requests.labels(name, str(response.status)).inc()
        return response

    return middleware


def build_app(placement: Placement, metrics: PlacementMetrics, auth: Authenticator
              ) -> web.Application:
    app = web.Application(middlewares=[errors_middleware(metrics), auth_middleware(auth)],
                          client_max_size=MAX_BODY_BYTES)
    handlers = Routes(placement, metrics)
    app.add_routes([web.route(r.method, r.path, getattr(handlers, r.handler)) for r in ROUTES])
    return app


async def decoded(request: web.Request, kind: type[T]) -> T:
    """The body as `kind` (an empty body: its defaults); 422 naming the field otherwise."""
    raw = await request.read()
    return body_as(raw if raw.strip() else b"{}", kind)


async def json_object(request: web.Request) -> JsonObject:
    return await decoded(request, JsonObject)


class Routes:
    def __init__(self, placement: Placement, metrics: PlacementMetrics) -> None:
        self.p = placement
        self.metrics = metrics

    # -- apps ------------------------------------------------------------------------------

    async def create_app(self, request: web.Request) -> web.Response:
        return json_response(await self.p.create_app(await request.read()), 201)

    async def list_apps(self, request: web.Request) -> web.Response:
        principal = principal_of(request)
        return json_response([c for c in await self.p.apps() if principal.may_act_on(c.name)])

    async def get_app(self, request: web.Request) -> web.Response:
        return json_response(await self.p.app(request.match_info["app"]))

    async def patch_app(self, request: web.Request) -> web.Response:
        patch = await json_object(request)
        return json_response(await self.p.update_app(request.match_info["app"], patch))

    async def delete_app(self, request: web.Request) -> web.Response:
        return json_response(await self.p.delete_app(request.match_info["app"]))

    async def deploy(self, request: web.Request) -> web.Response:
        body = await decoded(request, DeployRequest)
        return json_response(await self.p.deploy(request.match_info["app"], body.image,
                                                 body.strategy, body.config))

    async def releases(self, request: web.Request) -> web.Response:
        return json_response(await self.p.releases(request.match_info["app"]))

    async def rollback(self, request: web.Request) -> web.Response:
        body = await decoded(request, RollbackRequest)
        release = await self.p.rollback(request.match_info["app"], body.version)
        return json_response(release, status=201)

    async def events(self, request: web.Request) -> web.Response:
        return json_response(await self.p.events(request.match_info["app"]))

    # -- secrets -----------------------------------------------------------------------------

    async def list_secrets(self, request: web.Request) -> web.Response:
        return json_response(await self.p.secrets.list(request.match_info["app"]))

    async def change_secrets(self, request: web.Request) -> web.Response:
        body = await decoded(request, SecretsRequest)
        return json_response(await self.p.secrets.change(request.match_info["app"], body))

    async def unset_secret(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = body_as({"unset": [name]}, SecretsRequest)  # 422 for what is no env name
        return json_response(await self.p.secrets.change(request.match_info["app"], body))

    # -- machines ----------------------------------------------------------------------------

    async def list_machines(self, request: web.Request) -> web.Response:
        return json_response(await self.p.machines.list(request.match_info["app"]))

    async def create_machine(self, request: web.Request) -> web.Response:
        body = await decoded(request, CreateMachineRequest)
        return json_response(await self.p.machines.create(request.match_info["app"], body), 201)

    async def _machine(self, request: web.Request, action: str = "") -> web.Response:
        view = await self.p.machines.call(request.match_info["app"],
                                          request.match_info["id"], action)
        return json_response(view, 202 if action == "destroy" else 200)  # (202: as agents)

    async def get_machine(self, request: web.Request) -> web.Response:
        return await self._machine(request)

    async def destroy_machine(self, request: web.Request) -> web.Response:
        return await self._machine(request, "destroy")

    async def start_machine(self, request: web.Request) -> web.Response:
        return await self._machine(request, "start")

    async def stop_machine(self, request: web.Request) -> web.Response:
        return await self._machine(request, "stop")

    async def suspend_machine(self, request: web.Request) -> web.Response:
        return await self._machine(request, "suspend")

    async def wait_machine(self, request: web.Request) -> web.Response:
        state = request.query.get("state", "started")
        if len(state) > 32:
            raise BadRequest("state is not a machine state")
        try:
            timeout_s = float(request.query.get("timeout_s", "60"))
        except ValueError:
            raise BadRequest("timeout_s must be a number") from None
        if not 0 < timeout_s <= MAX_WAIT_S:
            raise BadRequest(f"timeout_s must be in (0, {MAX_WAIT_S:g}]")
        return json_response(await self.p.machines.wait(
            request.match_info["app"], request.match_info["id"], state, timeout_s))

    async def logs(self, request: web.Request) -> web.Response:
        cursor = request.query.get("cursor", "")
        try:
            tail_bytes = int(request.query.get("tail_bytes", str(DEFAULT_TAIL)))
            return json_response(await self.p.logs(
                request.match_info["app"], cursor, min(max(tail_bytes, 0), MAX_TAIL),
                request.query.get("machine", "")[:64]))
        except (ValueError, BadCursor) as exc:
            raise BadRequest(f"tail_bytes must be an integer; cursor machine:offset pairs "
                             f"({exc})") from None

    async def placements(self, request: web.Request) -> web.Response:
        return json_response(await self.p.placements(request.match_info["app"]))

    async def workers(self, request: web.Request) -> web.Response:
        return json_response(await self.p.workers())

    # -- tokens ------------------------------------------------------------------------------

    async def create_token(self, request: web.Request) -> web.Response:
        body = await decoded(request, TokenRequest)
        return json_response(await self.p.tokens.create(body), 201)

    async def list_tokens(self, request: web.Request) -> web.Response:
        return json_response(await self.p.tokens.list())

    async def revoke_token(self, request: web.Request) -> web.Response:
        return json_response(await self.p.tokens.revoke(request.match_info["id"]))

    # -- internal ----------------------------------------------------------------------------

    async def wake(self, request: web.Request) -> web.StreamResponse:
        """The plain answer, or, to an edge that accepts the stream, the prediction as soon
        as it is made and then the answer (placement/api.py WAKE_STREAM_TYPE): the wake
        runs as a task here, and the first of the two to come decides the form."""
        wake = await decoded(request, WakeRequest)
        began = time.perf_counter()
        outcome = "error"
        predicted: asyncio.Future[WakePrediction] = asyncio.get_running_loop().create_future()

        def sink(prediction: WakePrediction) -> None:
            if not predicted.done():
                predicted.set_result(prediction)

        with predictions_to(sink):
            task = asyncio.ensure_future(self.p.wake(request.match_info["app"], wake))
        try:
            if WAKE_STREAM_TYPE in request.headers.get("Accept", ""):
                await asyncio.wait((task, predicted), return_when=asyncio.FIRST_COMPLETED)
            if predicted.done() and not task.done():  # (only after the wait above)
                response, outcome = await self._wake_stream(request, predicted.result(), task)
                return response
            answer = await task
            outcome = "ok"
            return json_response(answer)
        except PlacementError as exc:
            outcome = exc.code
            raise
        finally:
            task.cancel()  # (done already, unless the edge went away: as a plain wake)
            self.metrics.wake_seconds.labels(outcome).observe(time.perf_counter() - began)

    async def _wake_stream(self, request: web.Request, prediction: WakePrediction,
                           task: asyncio.Future[WakeResponse]
                           ) -> tuple[web.StreamResponse, str]:
        """200 and the prediction now; the answer (or the failure) as the last line."""
        response = web.StreamResponse(headers={"Content-Type": WAKE_STREAM_TYPE})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(msgspec.json.encode(prediction) + b"\n")
        last: WakeLine
        try:
            last, outcome = WakeAnswer(await task), "ok"
        except PlacementError as exc:
            last, outcome = WakeRefusal(exc.status, exc.code, exc.message), exc.code
        await response.write(msgspec.json.encode(last) + b"\n")
        await response.write_eof()
        return response, outcome

    async def autostop(self, request: web.Request) -> web.Response:
        await decoded(request, AutostopRequest)  # idle_s is informational
        view = await self.p.autostop(request.match_info["app"], request.match_info["id"])
        return json_response(view)

    async def suspect(self, request: web.Request) -> web.Response:
        report = await decoded(request, SuspectReport)
        worker = request.match_info["worker"]
        if len(worker) > 64:
            raise NotFound(f"worker {worker[:64]}… not found")
        return json_response(await self.p.suspect(worker, report))

    # -- public ------------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        ready, reason = await self.p.ready()
        return json_response(Readiness(ready=ready, reason=reason), 200 if ready else 503)

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_document())
