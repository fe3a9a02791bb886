"""Placement's admin listener (aiohttp): /metrics, /healthz, /readyz, and nothing else.

Metrics name every app and count its machines, so they are not on the public API
port: this listener binds loopback by default (`--admin-host`, `--admin-port`), as
the edge's admin port does, and Prometheus scrapes it there.
"""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web

from placement.api import Health, Readiness
from placement.metrics import PlacementMetrics
from placement.service import Placement
from placement.store import StoreUnavailable

log = logging.getLogger("thaw.placement")


def build_admin_app(placement: Placement, metrics: PlacementMetrics) -> web.Application:
    app = web.Application()

    async def metrics_text(request: web.Request) -> web.Response:
        try:
            await placement.apps()  # the per-app series are of the apps stored now
        except StoreUnavailable as exc:  # metrics matter most then: of the apps last seen
            log.warning("/metrics: %s", exc.message)
        return web.Response(body=metrics.render(), content_type="text/plain")

    async def healthz(request: web.Request) -> web.Response:
        return _json(Health(ok=True))

    async def readyz(request: web.Request) -> web.Response:
        ready, reason = await placement.ready()
        return _json(Readiness(ready=ready, reason=reason), 200 if ready else 503)

    app.add_routes([web.get("/metrics", metrics_text), web.get("/healthz", healthz),
                    web.get("/readyz", readyz)])
    return app


def _json(value: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), status=status,
                        content_type="application/json")
