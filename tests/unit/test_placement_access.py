"""Route access: every (access, caller) pair decided (pure)."""

from __future__ import annotations

import pytest

from ground.auth.tokens import Principal
from placement.core.access import UNAUTHORIZED, Access, authorize

ADMIN = Principal("a", admin=True)
HELLO = Principal("h", admin=False, apps=frozenset({"hello"}))

# (access, principal, app) -> status or None (allowed)
CASES = [
    (Access.PUBLIC, None, None, None),
    (Access.SIGNED, None, "hello", None),
    (Access.TOKEN, None, None, 401),
    (Access.TOKEN, HELLO, None, None),
    (Access.TOKEN, ADMIN, None, None),
    (Access.APP, None, "hello", 401),
    (Access.APP, HELLO, "hello", None),
    (Access.APP, HELLO, "other", 404),
    (Access.APP, ADMIN, "other", None),
    (Access.ADMIN, None, None, 401),
    (Access.ADMIN, HELLO, None, 403),
    (Access.ADMIN, ADMIN, None, None),
]


@pytest.mark.parametrize(("access", "principal", "app", "status"), CASES)
def test_every_access_and_caller_pair_is_decided(access: Access, principal: Principal | None,
                                                 app: str | None, status: int | None) -> None:
    denied = authorize(access, principal, app)
    assert (denied.status if denied else None) == status


def test_every_access_kind_is_covered_by_the_table() -> None:
    assert {case[0] for case in CASES} == set(Access)


def test_another_apps_resource_answers_as_an_unknown_app_would() -> None:
    denied = authorize(Access.APP, HELLO, "other")
    assert denied is not None and (denied.code, denied.message) == ("not_found",
                                                                     "app other not found")
    assert authorize(Access.ADMIN, None, None) is UNAUTHORIZED
