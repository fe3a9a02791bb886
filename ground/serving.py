"""How a service's HTTP API (aiohttp) stops.

Requests in flight get `DRAIN_S` to finish; then they are cancelled and their
connections closed. aiohttp's own default is 60 s: one owner's long wait, or a wake
held for a machine, would hold a service's stop (and a restart, and a host's shutdown)
that long. A long poll ends at once with `ShuttingDown` (503): its caller asks again,
or asks another.
"""

from __future__ import annotations

from aiohttp import web

from ground.errors import ServiceError

DRAIN_S = 5.0


class ShuttingDown(ServiceError):
    status = 503
    code = "shutting_down"


def app_runner(app: web.Application) -> web.AppRunner:
    """A runner for `app` that stops within `DRAIN_S` (no access log: the services log
    what they decide, not each call)."""
    return web.AppRunner(app, access_log=None, shutdown_timeout=DRAIN_S)
