"""Placement's routes as data: method, path, handler, who may call it, what it takes and
answers. The server (http.py), the authorisation middleware, the OpenAPI document
(placement/openapi.py) and the tests that walk every route are all built from ROUTES,
so a route cannot be added without saying who may call it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.api import MACHINE_STATES, MachineView
from ground.appconfig import AppConfig
from placement.api import (
    AppDeleted,
    AppEvent,
    AutostopRequest,
    CreateMachineRequest,
    DecisionView,
    DeployRequest,
    DeployResult,
    Health,
    JsonObject,
    LogsAnswer,
    MachineWaited,
    Readiness,
    Release,
    RollbackRequest,
    SecretsChanged,
    SecretsRequest,
    SecretView,
    SuspectAnswer,
    SuspectReport,
    TokenCreated,
    TokenRequest,
    TokenView,
    WakeRequest,
    WakeResponse,
    WorkerView,
)
from placement.core.access import Access
from placement.core.logs import MAX_CURSOR_CHARS
from placement.machinelogs import MAX_TAIL

APP = "/v1/apps/{app}"
MACHINE = APP + "/machines/{id}"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: str  # a method of http.Routes
    access: Access
    summary: str
    body: Any = None  # the request body's type (None: no body)
    answer: Any = None  # the success body's type (None: not JSON)
    status: int = 200  # the success status
    query: tuple[tuple[str, JsonObject, str], ...] = ()  # (name, JSON Schema, description)


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/apps", "create_app", Access.ADMIN,
          "Create an app (the image is resolved and pinned now)", AppConfig, AppConfig, 201),
    Route("GET", "/v1/apps", "list_apps", Access.TOKEN,
          "List the apps this token may see", None, list[AppConfig]),
    Route("GET", APP, "get_app", Access.APP, "Show an app", None, AppConfig),
    Route("PATCH", APP, "patch_app", Access.APP,
          "Update an app (JSON merge patch of AppConfig fields)", JsonObject, AppConfig),
    Route("DELETE", APP, "delete_app", Access.APP,
          "Delete an app, destroy its machines, revoke tokens scoped to it", None, AppDeleted),
    Route("POST", APP + "/deploy", "deploy", Access.APP,
          "Resolve and pin the image; a change of what machines are made from is a new "
          "release, rolled out by its strategy", DeployRequest, DeployResult),
    Route("GET", APP + "/releases", "releases", Access.APP,
          "The app's releases, newest first", None, list[Release]),
    Route("POST", APP + "/rollback", "rollback", Access.APP,
          "A new release made from an earlier one", RollbackRequest, Release, 201),
    Route("GET", APP + "/events", "events", Access.APP,
          "What the reconciler did to the app and why, newest first", None, list[AppEvent]),
    Route("GET", APP + "/secrets", "list_secrets", Access.APP,
          "The app's secrets: names and digests, never values", None, list[SecretView]),
    Route("POST", APP + "/secrets", "change_secrets", Access.APP,
          "Set and unset secrets (encrypted at rest, never answered); a change is a new "
          "release", SecretsRequest, SecretsChanged),
    Route("DELETE", APP + "/secrets/{name}", "unset_secret", Access.APP,
          "Unset one secret (a new release)", None, SecretsChanged),
    Route("GET", APP + "/machines", "list_machines", Access.APP,
          "The app's machines, as their agents report them", None, list[MachineView]),
    Route("POST", APP + "/machines", "create_machine", Access.APP,
          "Place one new machine through the market", CreateMachineRequest, MachineView, 201),
    Route("GET", MACHINE, "get_machine", Access.APP, "Show a machine", None, MachineView),
    Route("DELETE", MACHINE, "destroy_machine", Access.APP, "Destroy a machine", None,
          MachineView, 202),
    Route("POST", MACHINE + "/start", "start_machine", Access.APP, "Start a machine", None,
          MachineView),
    Route("POST", MACHINE + "/stop", "stop_machine", Access.APP, "Stop a machine", None,
          MachineView),
    Route("POST", MACHINE + "/suspend", "suspend_machine", Access.APP, "Suspend a machine",
          None, MachineView),
    Route("GET", MACHINE + "/wait", "wait_machine", Access.APP,
          "Wait until the machine is in ?state= (at most ?timeout_s= seconds)", None,
          MachineWaited, query=(
              ("state", {"type": "string", "enum": list(MACHINE_STATES)}, "default started"),
              ("timeout_s", {"type": "number", "exclusiveMinimum": 0, "maximum": 300},
               "seconds (default 60)"))),
    Route("GET", APP + "/logs", "logs", Access.APP,
          "The app's machine logs: each machine's lines from its tail, or since ?cursor= "
          "(the cursor of the last answer, to follow)", None, LogsAnswer, query=(
              ("cursor", {"type": "string", "maxLength": MAX_CURSOR_CHARS,
                          "pattern": "^[A-Za-z0-9_:,-]*$"},
               "machine:offset pairs from the last answer"),
              ("tail_bytes", {"type": "integer", "minimum": 0, "maximum": MAX_TAIL},
               "bytes of each log's tail on a first read (default 16384)"),
              ("machine", {"type": "string", "pattern": "^[A-Za-z0-9_-]{0,64}$"},
               "only this machine's log (default: the newest 100 machines')"))),
    Route("GET", APP + "/placements", "placements", Access.APP,
          "The last placement decisions, with per-term breakdowns and filter reasons",
          None, list[DecisionView]),
    Route("GET", "/v1/workers", "workers", Access.ADMIN, "Workers, from the registry", None,
          list[WorkerView]),
    Route("POST", "/v1/tokens", "create_token", Access.ADMIN,
          "Create a token (its secret is shown in this answer only)", TokenRequest,
          TokenCreated, 201),
    Route("GET", "/v1/tokens", "list_tokens", Access.ADMIN, "List tokens (never secrets)", None,
          list[TokenView]),
    Route("DELETE", "/v1/tokens/{id}", "revoke_token", Access.ADMIN, "Revoke a token", None,
          TokenView),
    Route("POST", "/internal/apps/{app}/wake", "wake", Access.SIGNED,
          "The edge's cold path: start machines within the deadline", WakeRequest,
          WakeResponse),
    Route("POST", "/internal/apps/{app}/machines/{id}/autostop", "autostop", Access.SIGNED,
          "The edge saw a machine idle: stop or suspend it per auto_stop", AutostopRequest,
          MachineView),
    Route("POST", "/internal/workers/{worker}/suspect", "suspect", Access.SIGNED,
          "The edge could not connect to a machine on this worker: placement checks and "
          "may count the worker failed", SuspectReport, SuspectAnswer),
    Route("GET", "/healthz", "healthz", Access.PUBLIC, "Liveness", None, Health),
    Route("GET", "/readyz", "readyz", Access.PUBLIC,
          "Readiness: the registry answers and the apps are published to it (503 with the "
          "reason otherwise)", None, Readiness),
    Route("GET", "/openapi.json", "openapi", Access.PUBLIC, "This document"),
)
