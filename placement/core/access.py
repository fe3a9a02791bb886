"""Who may call which route: the decision after a request's credential is known.

Every route of placement's API declares one `Access`. `authorize` maps the caller
(None: no valid token) onto it: 401 without a credential; an app route that names
an app the token does not cover answers exactly as an app that does not exist
(404, never 403 — a tenant learns nothing of another's apps); a route that needs
an admin answers 403, which names no resource. Signed internal routes are judged
by their signature, not here. It must not know HTTP frameworks, stores or clocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ground.auth.tokens import Principal


class Access(Enum):
    PUBLIC = "public"  # health, metrics, the API document
    SIGNED = "signed"  # internal: cluster-key signature, no token
    TOKEN = "token"  # any valid token (answers are filtered to its apps)
    APP = "app"  # a token covering the route's {app}
    ADMIN = "admin"  # an admin token


@dataclass(frozen=True)
class Denied:
    status: int
    code: str
    message: str
    reason: str  # for the log only


UNAUTHORIZED = Denied(401, "unauthorized", "a valid bearer token is required", "no valid token")


def authorize(access: Access, principal: Principal | None, app: str | None) -> Denied | None:
    """None when `principal` may call a route of `access` on `app` (its {app}, if any)."""
    if access in (Access.PUBLIC, Access.SIGNED):
        return None
    if principal is None:
        return UNAUTHORIZED
    if access is Access.ADMIN and not principal.admin:
        return Denied(403, "forbidden", "this needs an admin token", "not an admin token")
    if access is Access.APP and (app is None or not principal.may_act_on(app)):
        return Denied(404, "not_found", f"app {app} not found", f"token does not cover {app}")
    return None
