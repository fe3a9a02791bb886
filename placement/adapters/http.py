"""Placement's HTTP API (aiohttp): public `/v1`, internal `/internal`, metrics, health.

Errors become `{"error": code, "message": text}` in one middleware; a config that
fails validation is 422 naming the field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from placement.api import WakeRequest
from placement.errors import BadRequest, PlacementError
from placement.metrics import PlacementMetrics
from placement.openapi import OPENAPI
from placement.service import MACHINE_ACTIONS, Placement
from thaw.appconfig import InvalidConfig

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = logging.getLogger("thaw.placement")
MAX_WAIT_S = 300.0


def json_response(value: object, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), status=status,
                        content_type="application/json", headers=headers)


def errors_middleware(metrics: PlacementMetrics) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except PlacementError as exc:
            headers = {"Retry-After": "1"} if exc.status == 503 else None
            response = json_response(exc.body(), exc.status, headers)
        except InvalidConfig as exc:
            response = json_response(
                {"error": "invalid_config", "field": exc.field, "message": exc.reason}, 422
            )
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            response = json_response({"error": "invalid", "message": str(exc)}, 422)
        except web.HTTPException as exc:  # aiohttp's own 404/405/413: JSON like the rest
            code = exc.reason.lower().replace(" ", "_")
            response = json_response({"error": code, "message": exc.reason}, exc.status)
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            response = json_response({"error": "internal", "message": "internal error"}, 500)
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        metrics.requests.labels(name, str(response.status)).inc()
        return response

    return middleware


def build_app(placement: Placement, metrics: PlacementMetrics) -> web.Application:
    app = web.Application(middlewares=[errors_middleware(metrics)], client_max_size=1 << 20)
    r = Routes(placement, metrics)
    machine = "/v1/apps/{app}/machines/{id}"
    app.add_routes([
        web.post("/v1/apps", r.create_app),
        web.get("/v1/apps", r.list_apps),
        web.get("/v1/apps/{app}", r.get_app),
        web.patch("/v1/apps/{app}", r.patch_app),
        web.delete("/v1/apps/{app}", r.delete_app),
        web.post("/v1/apps/{app}/deploy", r.deploy),
        web.get("/v1/apps/{app}/machines", r.list_machines),
        web.post("/v1/apps/{app}/machines", r.create_machine),
        web.get(machine, r.get_machine),
        web.delete(machine, r.destroy_machine),
        web.get(machine + "/wait", r.wait_machine),
        web.post(machine + "/{action}", r.machine_action),
        web.get("/v1/apps/{app}/placements", r.placements),
        web.get("/v1/workers", r.workers),
        web.post("/internal/apps/{app}/wake", r.wake),
        web.post("/internal/apps/{app}/machines/{id}/autostop", r.autostop),
        web.get("/metrics", r.metrics_text),
        web.get("/healthz", r.healthz),
        web.get("/openapi.json", r.openapi),
    ])
    return app


async def json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidConfig("body", f"not valid JSON: {exc}") from None


class Routes:
    def __init__(self, placement: Placement, metrics: PlacementMetrics) -> None:
        self.p = placement
        self.metrics = metrics

    async def create_app(self, request: web.Request) -> web.Response:
        config = await self.p.create_app(await request.read())
        return json_response(config, 201)

    async def list_apps(self, request: web.Request) -> web.Response:
        return json_response(self.p.store.list())

    async def get_app(self, request: web.Request) -> web.Response:
        return json_response(self.p.app(request.match_info["app"]))

    async def patch_app(self, request: web.Request) -> web.Response:
        config = await self.p.update_app(request.match_info["app"], await json_body(request))
        return json_response(config)

    async def delete_app(self, request: web.Request) -> web.Response:
        destroyed = await self.p.delete_app(request.match_info["app"])
        return json_response({"deleted": request.match_info["app"], "machines": destroyed})

    async def deploy(self, request: web.Request) -> web.Response:
        return json_response(await self.p.deploy(request.match_info["app"],
                                                 await json_body(request)))

    async def list_machines(self, request: web.Request) -> web.Response:
        return json_response(await self.p.machines(request.match_info["app"]))

    async def create_machine(self, request: web.Request) -> web.Response:
        view = await self.p.create_machine(request.match_info["app"], await json_body(request))
        return json_response(view, 201)

    async def get_machine(self, request: web.Request) -> web.Response:
        status, body = await self.p.machine(request.match_info["app"], request.match_info["id"])
        return json_response(body, status)

    async def destroy_machine(self, request: web.Request) -> web.Response:
        status, body = await self.p.machine(
            request.match_info["app"], request.match_info["id"], "DELETE"
        )
        return json_response(body, status)

    async def machine_action(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        if action not in MACHINE_ACTIONS:
            raise PlacementError(f"no action {action!r}", code="not_found", status=404)
        status, body = await self.p.machine(
            request.match_info["app"], request.match_info["id"], "POST", action
        )
        return json_response(body, status)

    async def wait_machine(self, request: web.Request) -> web.Response:
        state = request.query.get("state", "started")
        try:
            timeout_s = float(request.query.get("timeout_s", "60"))
        except ValueError:
            raise BadRequest("timeout_s must be a number") from None
        if not 0 < timeout_s <= MAX_WAIT_S:
            raise BadRequest(f"timeout_s must be in (0, {MAX_WAIT_S:g}]")
        status, body = await self.p.machine(
            request.match_info["app"], request.match_info["id"], "GET", "wait",
            params={"state": state, "timeout_s": str(timeout_s)}, timeout_s=timeout_s + 5,
        )
        return json_response(body, status)

    async def placements(self, request: web.Request) -> web.Response:
        return json_response(self.p.placements(request.match_info["app"]))

    async def workers(self, request: web.Request) -> web.Response:
        return json_response(await self.p.workers())

    async def wake(self, request: web.Request) -> web.Response:
        raw = await request.read()
        wake = msgspec.json.decode(raw, type=WakeRequest) if raw.strip() else WakeRequest()
        began = time.perf_counter()
        outcome = "error"
        try:
            answer = await self.p.wake(request.match_info["app"], wake)
            outcome = "ok"
            return json_response(answer)
        except PlacementError as exc:
            outcome = exc.code
            raise
        finally:
            self.metrics.wake_seconds.labels(outcome).observe(time.perf_counter() - began)

    async def autostop(self, request: web.Request) -> web.Response:
        await json_body(request)  # AutostopRequest: idle_s is informational
        view = await self.p.autostop(request.match_info["app"], request.match_info["id"])
        return json_response(view)

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain")

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"ok": True})

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(OPENAPI)
