"""The edge's admin port (aiohttp): /metrics, /healthz, /readyz, /v1/state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
from aiohttp import web

from edge.adapters.placement import PlacementClient
from edge.core.appwake import AppWakes
from edge.exchange import Exchange
from edge.metrics import EdgeMetrics
from edge.view import View
from ground.native import state as native_state


class Edge(Protocol):
    """What the admin server reads of the edge's shell."""

    view: View
    metrics: EdgeMetrics
    wakes: AppWakes[Exchange]
    closing: bool
    connections: set[Any]
    placement: PlacementClient


Readiness = Callable[[], Awaitable[tuple[bool, str]]]  # (ready, why not)
ViewState = Callable[[], dict[str, Any]]  # how the view stands with the registry


def build_admin_app(edge: Edge, readiness: Readiness,
                    view_state: ViewState | None = None) -> web.Application:
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=edge.metrics.render(), content_type="text/plain")

    async def healthz(request: web.Request) -> web.Response:
        return _json({"ok": not edge.closing})

    async def readyz(request: web.Request) -> web.Response:
        ready, reason = await readiness()
        return _json({"ready": True} if ready else {"ready": False, "reason": reason},
                     200 if ready else 503)

    async def state(request: web.Request) -> web.Response:
        found = state_of(edge)
        if view_state is not None:
            found["registry"] = view_state()
        return _json(found)

    app.add_routes([
        web.get("/metrics", metrics),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/v1/state", state),
    ])
    return app


def state_of(edge: Edge) -> dict[str, Any]:
    apps = {}
    for name, entry in sorted(edge.view.apps.items()):
        wake = edge.wakes.wake_in_flight(name)
        apps[name] = {
            "held": edge.wakes.held(name),
            "in_flight": entry.in_flight,
            "wake_in_flight": wake is not None,
            "starting": wake.count if wake is not None else 0,
            "machines": [
                {"id": m.id, "state": m.state, "address": m.address, "in_flight": m.in_flight,
                 "elsewhere": m.elsewhere, "draining": m.draining}
                for m in entry.machines.values()
            ],
            # suspended and starting machines in the registry: what the edge may thaw
            "resting": {mid: record.state for mid, record in sorted(entry.resting.items())},
        }
    on, why = native_state()
    client = edge.placement
    placements = {"given": list(client.given), "discovered": list(client.discovered),
                  "last_ok": client.last_ok, "failed": sorted(client.failed_at)}
    return {"held_total": edge.wakes.total, "connections": len(edge.connections),
            "native": {"on": on, "why": why}, "placements": placements, "apps": apps}


def _json(value: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), status=status,
                        content_type="application/json")
