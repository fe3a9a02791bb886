"""A hand-written OpenAPI 3 document of placement's API (served at /openapi.json)."""

from __future__ import annotations

from typing import Any


def _op(summary: str, responses: dict[str, str], body: str | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {code: {"description": text} for code, text in responses.items()},
    }
    if body is not None:
        op["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    return op


ERR = {"404": "unknown app or machine"}
APP = "/v1/apps/{app}"
MACHINE = APP + "/machines/{id}"

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "thaw placement", "version": "0.1.0",
             "description": "Apps and Machines API, the market, and the edge's wake call. "
                            "Errors are JSON {error, message}."},
    "paths": {
        "/v1/apps": {
            "get": _op("List apps", {"200": "app configs"}),
            "post": _op("Create an app", {"201": "created", "409": "exists",
                                          "422": "invalid_config naming the field"}, "AppConfig"),
        },
        APP: {
            "get": _op("Show an app", {"200": "app config", **ERR}),
            "patch": _op("Update an app (JSON merge patch)",
                         {"200": "app config", "422": "invalid_config", **ERR}, "AppConfig"),
            "delete": _op("Delete an app and destroy its machines", {"200": "deleted", **ERR}),
        },
        APP + "/deploy": {
            "post": _op("Pin the image digest; create min_machines_running machines and spares",
                        {"200": "deployed", "503": "no_capacity", **ERR}, "DeployRequest"),
        },
        APP + "/machines": {
            "get": _op("List the app's machines (as the agents report them)", {"200": "machines"}),
            "post": _op("Place one new machine through the market",
                        {"201": "machine", "409": "max_machines", "503": "no_capacity", **ERR},
                        "CreateMachine"),
        },
        MACHINE: {
            "get": _op("Show a machine", {"200": "machine", **ERR}),
            "delete": _op("Destroy a machine", {"202": "destroying", **ERR}),
        },
        MACHINE + "/start": {"post": _op("Start", {"200": "machine", "409": "illegal"})},
        MACHINE + "/stop": {"post": _op("Stop", {"200": "machine", "409": "illegal"})},
        MACHINE + "/suspend": {"post": _op("Suspend", {"200": "machine", "409": "illegal"})},
        MACHINE + "/wait": {
            "get": _op("Wait for ?state= up to ?timeout_s=",
                       {"200": "reached", "408": "timeout", "409": "machine_failed"}),
        },
        APP + "/placements": {
            "get": _op("Last decisions with per-term breakdowns and filter reasons",
                       {"200": "decisions, newest first", **ERR}),
        },
        "/v1/workers": {"get": _op("Workers from the registry", {"200": "workers"})},
        "/internal/apps/{app}/wake": {
            "post": _op("Start machines within the deadline (the edge's cold path)",
                        {"200": "WakeResponse", "404": "not_found", "503": "no_capacity or "
                         "start_failed (Retry-After)", "504": "deadline"}, "WakeRequest"),
        },
        "/internal/apps/{app}/machines/{id}/autostop": {
            "post": _op("Stop or suspend an idle machine per auto_stop",
                        {"200": "machine", "409": "min_machines_running or auto_stop_off"},
                        "AutostopRequest"),
        },
        "/metrics": {"get": _op("Prometheus metrics", {"200": "text"})},
        "/healthz": {"get": _op("Liveness", {"200": "ok"})},
    },
    "components": {
        "schemas": {
            "AppConfig": {"type": "object", "required": ["name", "image"],
                          "description": "See thaw/appconfig.py: name, image, regions, guest, "
                                         "min_machines_running, max_machines, concurrency, "
                                         "auto_stop, spares, health, …"},
            "DeployRequest": {"type": "object", "properties": {"image": {"type": "string"}}},
            "CreateMachine": {"type": "object", "properties": {
                "start": {"type": "boolean", "default": True}, "region": {"type": "string"}}},
            "WakeRequest": {"type": "object", "properties": {
                "count": {"type": "integer", "default": 1},
                "deadline_ms": {"type": "integer", "default": 30000},
                "region": {"type": "string", "default": ""}}},
            "AutostopRequest": {"type": "object", "properties": {"idle_s": {"type": "number"}}},
        }
    },
}
