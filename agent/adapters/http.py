"""The agent's internal HTTP API (aiohttp). Errors become JSON in one middleware.

Every route but `/healthz`, `/readyz` and `/metrics` answers only calls signed with the
cluster key and addressed to this agent (ground/auth/signing.py); anything else is 401 and
does nothing.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from agent.api import HealthView, OfferRequest, PullRequest
from agent.core.machine import IllegalTransition, MachineState
from agent.core.records import MachineSpec
from agent.core.state import thawed
from agent.errors import AgentError, BadRequest
from agent.launch import machine_dir
from agent.machinelog import read_log_from
from agent.publisher import Publisher, machine_view
from agent.service import Agent
from ground.appconfig import MAX_ENV_BYTES
from ground.auth.aiohttp_glue import refusal, unsigned_answer
from ground.auth.signing import Verifier
from ground.errors import ServiceError
from imagecache.errors import ImageError

IMAGE_ERROR_STATUS = {
    "bad_reference": 400,
    "forbidden_host": 403,
    "not_found": 404,
    "unauthorized": 401,
    "digest_mismatch": 422,
    "size_mismatch": 422,
    "unsafe_layer": 422,
    "no_space": 507,  # this worker has no room for it now
    "io_error": 502,
}
MAX_WAIT_S = 300.0
log = logging.getLogger("thaw.agent")
UNSIGNED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(value: object, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(value), status=status, content_type="application/json"
    )


def error_response(status: int, code: str, message: str) -> web.Response:
    return json_response({"error": code, "message": message}, status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServiceError as exc:  # the agent's own (AgentError), and ShuttingDown
        return error_response(exc.status, exc.code, exc.message)
    except IllegalTransition as exc:
        return error_response(409, "illegal_transition", str(exc))
    except ImageError as exc:
        return error_response(IMAGE_ERROR_STATUS.get(exc.code, 502), exc.code, str(exc))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return error_response(422, "invalid", str(exc))
    except RecursionError:
        return error_response(422, "invalid", "nested too deeply")
    except UnicodeDecodeError:
        return error_response(422, "invalid", "not valid UTF-8")
    except web.HTTPException:
        raise  # aiohttp's own 404/405/413
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, "internal", "internal error")


def signature_middleware(verifier: Verifier) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in UNSIGNED_PATHS and await refusal(verifier, request) is not None:
            return unsigned_answer()
        return await handler(request)

    return middleware


def build_app(agent: Agent, publisher: Publisher, verifier: Verifier) -> web.Application:
    app = web.Application(middlewares=[errors_middleware, signature_middleware(verifier)],
                          client_max_size=1 << 20)
    routes = AgentRoutes(agent, publisher)
    app.add_routes(
        [
            web.post("/v1/offers", routes.offer),
            web.get("/v1/machines", routes.list_machines),
            web.get("/v1/machines/{id}", routes.get_machine),
            web.delete("/v1/machines/{id}", routes.destroy),
            web.post("/v1/machines/{id}/start", routes.start),
            web.post("/v1/machines/{id}/stop", routes.stop),
            web.post("/v1/machines/{id}/suspend", routes.suspend),
            web.get("/v1/machines/{id}/wait", routes.wait),
            web.get("/v1/machines/{id}/logs", routes.logs),
            web.get("/v1/status", routes.status),
            web.post("/v1/images/pull", routes.pull),
            web.get("/metrics", routes.metrics),
            web.get("/healthz", routes.healthz),
            web.get("/readyz", routes.readyz),
        ]
    )
    return app


class AgentRoutes:
    def __init__(self, agent: Agent, publisher: Publisher) -> None:
        self.agent = agent
        self.publisher = publisher

    def _view(self, mid: str, status: int = 200) -> web.Response:
        return json_response(machine_view(self.agent, self.agent.machine(mid)), status)

    def _fenced(self, request: web.Request, app: str) -> None:
        """The call's fencing token (`?fence=`, signed with the URL) checked for `app`."""
        self.agent.fence(app, fence_token(request))

    def _machine_fenced(self, request: web.Request) -> str:
        mid = request.match_info["id"]
        self._fenced(request, self.agent.machine(mid).spec.app)
        return mid

    async def offer(self, request: web.Request) -> web.Response:
        offer = msgspec.json.decode(await request.read(), type=OfferRequest)
        spec = spec_from_offer(offer)
        self._fenced(request, spec.app)
        known = offer.key in self.agent.state.offers
        machine = self.agent.offer(offer.key, spec, offer.start, offer.spare, offer.id)
        await self.agent.durable()  # answered once on disk: the offer holds after a crash
        return self._view(machine.id, 200 if known else 201)

    async def list_machines(self, request: web.Request) -> web.Response:
        app = request.query.get("app")
        views = [
            machine_view(self.agent, m)
            for m in self.agent.state.machines.values()
            if app is None or m.spec.app == app
        ]
        return json_response(views)

    async def get_machine(self, request: web.Request) -> web.Response:
        return self._view(request.match_info["id"])

    async def destroy(self, request: web.Request) -> web.Response:
        machine = self.agent.destroy(self._machine_fenced(request))
        await self.agent.durable()
        return json_response(machine_view(self.agent, machine), 202)

    async def start(self, request: web.Request) -> web.Response:
        """Start; with `?wait_s=` answer only once started (one round trip for callers
        that would start and then wait): 408 / 409 as for /wait. With `wait_s`, a machine
        already starting or started is waited for, not refused: the caller (placement,
        planning from the registry's view) wants it started, whoever started it.

        Every answer comes once the start is on disk — without `wait_s` at once, with it
        once `started` is (a later record: one fsync covers both), or, when the wait
        fails, before its error — except a resume's `started` (`thawed`): nothing new
        runs, its records are in the log's file already (an agent killed finds them; a
        host that loses them loses the process too), so it is answered as soon as the
        machine runs again and they reach the disk behind the answer (an fsync here is
        longer than the thaw itself)."""
        mid = self._machine_fenced(request)
        wait_s = wait_timeout(request, "wait_s", default="0")
        current = self.agent.machine(mid)
        if wait_s > 0 and current.state in (MachineState.STARTING, MachineState.STARTED):
            machine = current  # "make sure it is started": a caller with a stale view is fine
        else:
            machine = self.agent.start(mid)
        if wait_s <= 0:
            await self.agent.durable()
            return json_response(machine_view(self.agent, machine))
        try:
            waited = await self.agent.wait(mid, MachineState.STARTED, wait_s, durable=False)
        except AgentError:
            await self.agent.durable()
            raise
        machine = waited if waited is not None else machine
        if thawed(machine):
            self.agent.sync_soon()
        else:
            await self.agent.durable()
        return json_response(machine_view(self.agent, machine))

    async def stop(self, request: web.Request) -> web.Response:
        machine = self.agent.stop(self._machine_fenced(request))
        await self.agent.durable()
        return json_response(machine_view(self.agent, machine))

    async def suspend(self, request: web.Request) -> web.Response:
        machine = await self.agent.suspend(self._machine_fenced(request))
        return json_response(machine_view(self.agent, machine))

    async def wait(self, request: web.Request) -> web.Response:
        mid = request.match_info["id"]
        try:
            target = MachineState(request.query.get("state", "started"))
        except ValueError as exc:
            raise BadRequest(f"bad wait parameters: {exc}") from None
        timeout_s = wait_timeout(request, "timeout_s", default="60")
        if timeout_s == 0:
            raise BadRequest(f"timeout_s must be in (0, {MAX_WAIT_S:g}]")
        self.agent.machine(mid)
        machine = await self.agent.wait(mid, target, timeout_s)
        if machine is None:
            return json_response({"id": mid, "state": MachineState.DESTROYED.value})
        return json_response(machine_view(self.agent, machine))

    async def logs(self, request: web.Request) -> web.Response:
        mid = request.match_info["id"]
        self.agent.machine(mid)
        try:
            tail = int(request.query.get("tail_bytes", "65536"))
            offset = int(request.query.get("offset", "-1"))
        except ValueError:
            raise BadRequest("tail_bytes and offset must be integers") from None
        start, size, data = read_log_from(machine_dir(self.agent.config.state_dir, mid) / "log",
                                          offset, tail)
        return web.Response(body=data, content_type="text/plain", charset="utf-8",
                            headers={"X-Log-Offset": str(start), "X-Log-Size": str(size)})

    async def status(self, request: web.Request) -> web.Response:
        return json_response(self.publisher.status())

    async def pull(self, request: web.Request) -> web.Response:
        body = msgspec.json.decode(await request.read(), type=PullRequest)
        return json_response(await self.agent.pull(body.ref))

    async def metrics(self, request: web.Request) -> web.Response:
        self.publisher.status()  # refresh gauges
        return web.Response(body=self.agent.metrics.render(), content_type="text/plain")

    async def healthz(self, request: web.Request) -> web.Response:
        broken = self.agent.journal.oplog.broken
        if broken:  # alive, but nothing it is asked can be made durable: not healthy
            return json_response(HealthView(False, self.agent.state.epoch, "log_broken",
                                            broken), 503)
        return json_response(HealthView(True, self.agent.state.epoch))

    async def readyz(self, request: web.Request) -> web.Response:
        ready, reason = await self.publisher.readiness()
        return json_response({"ready": True} if ready else {"ready": False, "reason": reason},
                             200 if ready else 503)


def fence_token(request: web.Request) -> int | None:
    """`?fence=`: a reconcile lease's fencing token (decimal, < 2**63), or None."""
    raw = request.query.get("fence")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and int(raw) < 2**63):
        raise BadRequest("fence must be a decimal token below 2**63")
    return int(raw)


def wait_timeout(request: web.Request, name: str, default: str) -> float:
    """A wait bound in seconds from the query: in [0, MAX_WAIT_S], else 400."""
    try:
        value = float(request.query.get(name, default))
    except ValueError:
        raise BadRequest(f"{name} must be a number of seconds") from None
    if not 0 <= value <= MAX_WAIT_S:
        raise BadRequest(f"{name} must be in [0, {MAX_WAIT_S:g}]")
    return value


def spec_from_offer(offer: OfferRequest) -> MachineSpec:
    """Validate an offer's machine spec; 422 naming the field."""
    if not offer.app:
        raise AgentError("app must not be empty", code="invalid", status=422)
    if not offer.image:
        raise AgentError("image must not be empty", code="invalid", status=422)
    if offer.guest.cpus <= 0 or offer.guest.memory_mb <= 0:
        raise AgentError("guest.cpus and guest.memory_mb must be > 0", code="invalid", status=422)
    if offer.kill_signal and offer.kill_signal not in signal.Signals.__members__:
        raise AgentError(f"kill_signal {offer.kill_signal!r} is not a signal", code="invalid",
                         status=422)
    env_bytes = sum(len(k.encode()) + len(v.encode()) for k, v in offer.env.items())
    if env_bytes > MAX_ENV_BYTES:
        raise AgentError(f"env: {env_bytes} bytes of names and values; at most "
                         f"{MAX_ENV_BYTES}", code="invalid", status=422)
    if offer.kill_timeout_s < 0 or offer.health.timeout_s <= 0:
        raise AgentError("kill_timeout_s must be >= 0, health.timeout_s > 0", code="invalid",
                         status=422)
    return MachineSpec(
        app=offer.app, image=offer.image, guest=offer.guest, env=dict(offer.env),
        health=offer.health, kill_signal=offer.kill_signal, kill_timeout_s=offer.kill_timeout_s,
        app_uid=offer.app_uid, release=offer.release, port=offer.port,
        entrypoint=list(offer.entrypoint), cmd=list(offer.cmd), sealed_env=offer.sealed_env,
        ticket=offer.ticket, for_spares=offer.for_spares,
    )
