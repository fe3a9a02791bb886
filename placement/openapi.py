"""Placement's OpenAPI 3.1 document, generated from the route table and the wire types.

Nothing is written by hand: paths, methods, who may call them (security), request
and answer bodies come from `routes.ROUTES`; the schemas from msgspec's JSON
Schema of the same types the server decodes and encodes, bounds included.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from placement.adapters.routes import ROUTES, Route
from placement.api import ErrorBody
from placement.core.access import Access
from thaw.appconfig import APP_NAME_PATTERN, ENV_NAME_PATTERN

REF = "#/components/schemas/{name}"
SECURITY = {
    Access.PUBLIC: [],
    Access.SIGNED: [{"clusterSignature": []}],
    Access.TOKEN: [{"bearer": []}],
    Access.APP: [{"bearer": []}],
    Access.ADMIN: [{"bearer": []}],
}
PATH_PARAMETERS = {
    "app": {"type": "string", "pattern": APP_NAME_PATTERN},
    "id": {"type": "string", "minLength": 1, "maxLength": 64},
    "worker": {"type": "string", "minLength": 1, "maxLength": 64},
    "name": {"type": "string", "pattern": ENV_NAME_PATTERN},  # a secret's
}


@functools.cache
def openapi_document() -> dict[str, Any]:
    types = [ErrorBody, *{t for r in ROUTES for t in (r.body, r.answer) if t is not None}]
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    schema_of = dict(zip(map(repr, types), schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, schema_of)
    return {
        "openapi": "3.1.0",
        "info": {"title": "thaw placement", "version": "0.2.0",
                 "description": "Apps, machines, tokens and the edge's wake call. Public "
                                "routes take `Authorization: Bearer <token>`; internal ones "
                                "a cluster-key signature. Errors are JSON {error, message}."},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "clusterSignature": {"type": "apiKey", "in": "header",
                                     "name": "X-Thaw-Signature"},
            },
        },
    }


def _operation(route: Route, schema_of: dict[str, Any]) -> dict[str, Any]:
    error = {"description": "an error: {error, message}",
             "content": {"application/json": {"schema": schema_of[repr(ErrorBody)]}}}
    success: dict[str, Any] = {"description": route.summary}
    if route.answer is not None:
        success["content"] = {"application/json": {"schema": schema_of[repr(route.answer)]}}
    elif route.handler == "openapi":
        success["content"] = {"application/json": {"schema": {"type": "object"}}}
    else:
        success["content"] = {"text/plain": {"schema": {"type": "string"}}}
    op: dict[str, Any] = {
        "operationId": route.handler,
        "summary": route.summary,
        "tags": ["internal" if route.access is Access.SIGNED else "public"],
        "security": SECURITY[route.access],
        "responses": {str(route.status): success, "default": error},
    }
    if route.access is not Access.PUBLIC:
        op["responses"]["401"] = {**error, "description": "no valid credential"}
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": PATH_PARAMETERS[name]}
        for name in PATH_PARAMETERS if "{" + name + "}" in route.path
    ]
    parameters += [
        {"name": name, "in": "query", "required": False, "description": text, "schema": schema}
        for name, schema, text in route.query
    ]
    if parameters:
        op["parameters"] = parameters
    if route.body is not None:
        op["requestBody"] = {
            "required": route.handler == "create_app",
            "content": {"application/json": {"schema": schema_of[repr(route.body)]}},
        }
    return op
