"""Placement's trust boundary, driven from its route table: tokens, scopes, signed calls.

Every route in ROUTES (and every route the server registers, so one added outside the
table fails here) is called without a token, with another app's token, and with an
app token where an admin one is needed; internal routes without, with stale,
replayed, tampered and rotated signatures.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import yarl

from ground.auth.signing import KeyRing
from placement.adapters.http import build_app
from placement.adapters.routes import ROUTES, Route
from placement.core.access import Access
from placement.metrics import PlacementMetrics
from tests.support.credentials import ADMIN_TOKEN, CLUSTER_KEY, RING, signed_headers
from tests.support.placement_helpers import Platform

pytestmark = pytest.mark.integration


def concrete(route: Route, app: str) -> str:
    path = route.path.replace("{app}", app)
    return re.sub(r"\{[a-z]+\}", "0123456789abcd", path)


async def head_or_call(p: Platform, method: str, path: str, token: str
                       ) -> tuple[int, dict[str, str]]:
    """Status and headers of one call (HEAD has no body to decode)."""
    assert p.http is not None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with p.http.request(method, p.url + path, headers=headers) as reply:
        await reply.read()
        return reply.status, dict(reply.headers)


async def token(p: Platform, **scope: Any) -> str:
    status, made = await p.call("POST", "/v1/tokens", scope)
    assert status == 201, made
    return str(made["token"])


def test_every_route_declares_who_may_call_it_and_app_routes_need_the_apps_scope() -> None:
    declared = {(r.method, r.path) for r in ROUTES}
    assert len(declared) == len(ROUTES)
    public = {r.path for r in ROUTES if r.access is Access.PUBLIC}
    # nothing else open; /metrics is on the admin listener only (tests/integration/
    # test_placement_tls.py)
    assert public == {"/healthz", "/readyz", "/openapi.json"}
    assert {r.path for r in ROUTES if r.access is Access.SIGNED} == {
        r.path for r in ROUTES if r.path.startswith("/internal/")}
    for route in ROUTES:
        assert isinstance(route.access, Access)
        if "{app}" in route.path and route.access is not Access.SIGNED:
            assert route.access is Access.APP, route  # an app's resources need its scope


async def test_every_public_route_without_a_token_is_401_with_a_bearer_challenge(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout)
        app = build_app(p.placement.placement, PlacementMetrics(), None)  # type: ignore[arg-type]
        registered = {(r.method, r.resource.canonical) for r in app.router.routes()
                      if r.resource is not None}
        declared = {(r.method, r.path) for r in ROUTES}
        # nothing outside the table; HEAD only as aiohttp's twin of a declared GET
        assert {m for m in registered if m[0] != "HEAD"} == declared
        assert {("GET", path) for method, path in registered if method == "HEAD"} <= declared
        for route in ROUTES:
            if route.access in (Access.PUBLIC, Access.SIGNED):
                continue
            for method in (route.method, "HEAD") if route.method == "GET" else (route.method,):
                for credential in ("", "thaw_0000000000000000_" + "A" * 43, "not-a-token"):
                    status, headers = await head_or_call(p, method, concrete(route, "hello"),
                                                         credential)
                    assert status == 401, (route, method, credential)
                    challenge = headers.get("WWW-Authenticate", "")
                    assert challenge.startswith('Bearer realm="thaw"'), (route, challenge)
                    assert ('error="invalid_token"' in challenge) == bool(credential)
        status, _ = await p.call("GET", "/healthz", token="")
        assert status == 200
        status, _ = await p.call("GET", "/openapi.json", token="")
        assert status == 200


async def test_another_apps_token_gets_404_on_every_app_route_and_403_on_admin_routes(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout)
        await p.create_app(name="other", image=hello_layout)
        others = await token(p, apps=["other"])
        for route in ROUTES:
            status, body = await p.call(route.method, concrete(route, "hello"), {},
                                        token=others, signed=False)
            if route.access is Access.APP:
                assert (status, body["error"]) == (404, "not_found"), (route, body)
                assert body["message"] == "app hello not found"
            elif route.access is Access.ADMIN:
                assert (status, body["error"]) == (403, "forbidden"), (route, body)
            elif route.access is Access.SIGNED:
                assert status == 401, route  # a token is no signature
            if route.method == "GET" and route.access in (Access.APP, Access.ADMIN):
                head, _ = await head_or_call(p, "HEAD", concrete(route, "hello"), others)
                assert head == status, (route, head)  # HEAD is allowed exactly as its GET
        # a method no route declares: aiohttp's 405 before any handler, the same for every
        # caller and every app name (existing or not), so it tells nothing
        for path in ("/v1/apps/hello", "/v1/apps/nope", "/v1/tokens", "/v1/apps/hello/machines"):
            for caller in (others, "", ADMIN_TOKEN):
                status, body = await p.call("PUT", path, {}, token=caller)
                assert (status, body["error"]) == (405, "method_not_allowed"), (path, caller)
        # an unknown app answers exactly as another tenant's does
        status, unknown = await p.call("GET", "/v1/apps/nope", token=others)
        status2, hidden = await p.call("GET", "/v1/apps/hello", token=others)
        assert (status, unknown["error"]) == (status2, hidden["error"]) == (404, "not_found")
        # the token lists and acts on its own app only
        status, listed = await p.call("GET", "/v1/apps", token=others)
        assert status == 200 and [a["name"] for a in listed] == ["other"]
        status, patched = await p.call("PATCH", "/v1/apps/other", {"max_machines": 2},
                                       token=others)
        assert status == 200 and patched["max_machines"] == 2


async def test_two_authorization_headers_are_refused_whatever_their_order(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout)
        mine = await token(p, apps=["hello"])
        assert p.http is not None
        for first, second in ((ADMIN_TOKEN, mine), (mine, ADMIN_TOKEN)):
            headers = [("Authorization", f"Bearer {first}"),
                       ("Authorization", f"Bearer {second}")]
            async with p.http.get(p.url + "/v1/workers", headers=headers) as reply:
                assert reply.status == 401


async def test_an_app_token_cannot_create_apps_or_tokens(tmp_path: Path, hello_layout: str) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout)
        mine = await token(p, apps=["hello"])
        status, body = await p.call("POST", "/v1/apps", {"name": "new", "image": hello_layout},
                                    token=mine)
        assert (status, body["error"]) == (403, "forbidden")
        status, body = await p.call("POST", "/v1/tokens", {"apps": ["hello"]}, token=mine)
        assert (status, body["error"]) == (403, "forbidden")
        assert (await p.call("GET", "/v1/apps/new"))[0] == 404


async def test_a_revoked_or_expired_token_is_401_and_deleting_an_app_revokes_its_tokens(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout)
        status, made = await p.call("POST", "/v1/tokens", {"apps": ["hello"], "name": "ci"})
        assert status == 201 and made["token"].startswith("thaw_")
        secret = made["token"]
        assert (await p.call("GET", "/v1/apps/hello", token=secret))[0] == 200
        status, revoked = await p.call("DELETE", f"/v1/tokens/{made['id']}")
        assert status == 200 and revoked["revoked_at"] is not None
        assert (await p.call("GET", "/v1/apps/hello", token=secret))[0] == 401
        # listed without secret or hash
        status, listed = await p.call("GET", "/v1/tokens")
        assert status == 200 and "token" not in listed[0] and "hash" not in listed[0]
        # expiry: a token past expires_at is refused (the store's record is aged by hand)
        fresh = await token(p, apps=["hello"], expires_in_s=60)
        assert (await p.call("GET", "/v1/apps/hello", token=fresh))[0] == 200
        tokens = p.placement.placement.tokens.store  # type: ignore[union-attr]
        [record] = [r for r in await tokens.list() if r.expires_at is not None]
        aged = msgspec.structs.replace(record, expires_at=time.time() - 1)
        async with p.placement._store.database.transaction() as tx:  # type: ignore[union-attr]
            await tx.execute("UPDATE tokens SET record = $1 WHERE id = $2",
                             msgspec.json.encode(aged), record.id)
        assert (await p.call("GET", "/v1/apps/hello", token=fresh))[0] == 401
        # deleting an app revokes tokens scoped to it: a new app of that name is not theirs
        third = await token(p, apps=["hello"])
        assert (await p.call("DELETE", "/v1/apps/hello"))[0] == 200
        await p.create_app(name="hello", image=hello_layout)
        assert (await p.call("GET", "/v1/apps/hello", token=third))[0] == 401


@pytest.mark.parametrize(("scope", "field"), [
    ({"admin": True, "apps": ["hello"]}, "apps"), ({}, "apps"), ({"apps": ["ghost"]}, "apps"),
    ({"apps": ["hello"], "expires_in_s": 10**12}, "expires_in_s"),
    ({"apps": ["hello"], "surprise": 1}, "surprise"),
])
async def test_a_token_request_out_of_bounds_is_422_naming_the_field(
    tmp_path: Path, hello_layout: str, scope: dict[str, Any], field: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout)
        status, body = await p.call("POST", "/v1/tokens", scope)
        assert (status, body.get("field")) == (422, field), body


# -- signed internal calls -----------------------------------------------------------------

WAKE = "/internal/apps/hello/wake"


async def raw_call(p: Platform, path: str, body: bytes, headers: dict[str, str]
                   ) -> tuple[int, Any]:
    assert p.http is not None
    async with p.http.post(yarl.URL(p.url + path, encoded=True), data=body,
                           headers={**headers, "Content-Type": "application/json"},
                           timeout=aiohttp.ClientTimeout(total=30)) as reply:
        return reply.status, await reply.json()


async def test_internal_routes_refuse_unsigned_stale_replayed_and_tampered_calls(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout)
        body = b'{"count": 1, "deadline_ms": 200}'
        status, _ = await raw_call(p, WAKE, body, {})
        assert status == 401
        stale = signed_headers("POST", p.url + WAKE, body, now=time.time() - 31)
        assert (await raw_call(p, WAKE, body, stale))[0] == 401
        good = signed_headers("POST", p.url + WAKE, body)
        first, _ = await raw_call(p, WAKE, body, good)
        assert first != 401  # no worker: 503, but it was let in
        assert (await raw_call(p, WAKE, body, good))[0] == 401  # the same call replayed
        tampered = signed_headers("POST", p.url + WAKE, body)
        assert (await raw_call(p, WAKE, b'{"count": 9, "deadline_ms": 200}', tampered))[0] \
            == 401
        other_path = signed_headers("POST", p.url + "/internal/apps/other/wake", body)
        assert (await raw_call(p, WAKE, body, other_path))[0] == 401
        wrong_key = signed_headers("POST", p.url + WAKE, body, ring=KeyRing.parse("w" * 40))
        assert (await raw_call(p, WAKE, body, wrong_key))[0] == 401


async def test_during_key_rotation_a_call_signed_with_the_previous_key_is_accepted(
    tmp_path: Path, hello_layout: str
) -> None:
    p = Platform(tmp_path, agents=0)
    new = "n" * 40
    rotating = KeyRing.parse(f"{new}\n{CLUSTER_KEY}")
    config = p.placement.config
    p.placement.config = config.__class__(**{**config.__dict__, "cluster_keys": rotating})
    async with p:
        await p.create_app(name="hello", image=hello_layout)
        body = b'{"count": 1, "deadline_ms": 200}'
        previous = signed_headers("POST", p.url + WAKE, body, ring=RING)
        assert (await raw_call(p, WAKE, body, previous))[0] != 401
        current = signed_headers("POST", p.url + WAKE, body, ring=KeyRing.parse(new))
        assert (await raw_call(p, WAKE, body, current))[0] != 401
