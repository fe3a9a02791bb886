"""Placement's OpenAPI 3.1 document, generated from the route table and the wire types.

Nothing is written by hand: paths, methods, who may call them (security), request
and answer bodies come from `routes.ROUTES`; the schemas from msgspec's JSON
Schema of the same types the server decodes and encodes, bounds included.
"""

from __future__ import annotations

import functools

import msgspec

from ground.appconfig import APP_NAME_PATTERN, ENV_NAME_PATTERN
from placement.adapters.routes import ROUTES, Route
from placement.api import ErrorBody, JsonObject
from placement.core.access import Access

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
def openapi_document() -> JsonObject:
    types = [ErrorBody, *{t for r in ROUTES for t in (r.body, r.answer) if t is not None}]
    schemas, components = msgspec.json.schema_components(types, ref_template=REF,
                                                         schema_hook=_any_json)
    schema_of = dict(zip(map(repr, types), schemas, strict=True))
    paths: dict[str, JsonObject] = {}
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



def _any_json(kind: type) -> JsonObject:
    """The schema of a `JsonObject`'s values (typed `object`: any JSON value, checked
    where read), which msgspec leaves to a hook."""
    if kind is object:
        return {"description": "any JSON value"}
    raise NotImplementedError(kind)


def _operation(route: Route, schema_of: dict[str, JsonObject]) -> JsonObject:
    error = {"description": "an error: {error, message}",
             "content": {"application/json": {"schema": schema_of[repr(ErrorBody)]}}}
    success: JsonObject = {"description": route.summary}
    if route.answer is not None:
        success["content"] = {"application/json": {"schema": schema_of[repr(route.answer)]}}
    elif route.handler == "openapi":
        success["content"] = {"application/json": {"schema": {"type": "object"}}}
    else:
        success["content"] = {"text/plain": {"schema": {"type": "string"}}}
    responses: JsonObject = {str(route.status): success, "default": error}
    if route.access is not Access.PUBLIC:
        responses["401"] = {**error, "description": "no valid credential"}
    op: JsonObject = {
        "operationId": route.handler,
        "summary": route.summary,
        "tags": ["internal" if route.access is Access.SIGNED else "public"],
        "security": SECURITY[route.access],
        "responses": responses,
    }
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
