"""The edge's admin port (aiohttp): /metrics, /healthz, /v1/state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from thaw.native import state as native_state

if TYPE_CHECKING:
    from edge.service import Edge


def build_admin_app(edge: Edge) -> web.Application:
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        for name in edge.view.apps:
            edge.metrics.held.labels(name).set(edge.holds.held(name))
        return web.Response(body=edge.metrics.render(), content_type="text/plain")

    async def healthz(request: web.Request) -> web.Response:
        return _json({"ok": not edge.closing})

    async def state(request: web.Request) -> web.Response:
        return _json(state_of(edge))

    app.add_routes([
        web.get("/metrics", metrics),
        web.get("/healthz", healthz),
        web.get("/v1/state", state),
    ])
    return app


def state_of(edge: Edge) -> dict[str, Any]:
    apps = {}
    for name, entry in sorted(edge.view.apps.items()):
        apps[name] = {
            "held": edge.holds.held(name),
            "in_flight": entry.in_flight,
            "wake_in_flight": entry.wake_in_flight,
            "starting": entry.starting,
            "machines": [
                {"id": m.id, "state": m.state, "address": m.address, "in_flight": m.in_flight,
                 "draining": m.draining}
                for m in entry.machines.values()
            ],
        }
    on, why = native_state()
    return {"held_total": edge.holds.total, "connections": len(edge.connections),
            "native": {"on": on, "why": why}, "apps": apps}


def _json(value: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), status=status,
                        content_type="application/json")
