"""Bearer tokens: format, hashing, and what a stored record lets in (pure, no IO)."""

from __future__ import annotations

import pytest

from ground.auth.tokens import (
    BOOTSTRAP_ID,
    Principal,
    Refused,
    TokenRecord,
    bearer_of,
    check_bootstrap,
    check_stored,
    make_token,
    token_hash,
    token_id_of,
)

SECRET = bytes(range(32))
TOKEN = make_token("0123456789abcdef", SECRET)


def record(**fields: object) -> TokenRecord:
    base: dict[str, object] = {"id": "0123456789abcdef", "hash": token_hash(TOKEN),
                               "admin": False, "apps": ["hello"], "name": "ci",
                               "created_at": 100.0}
    base.update(fields)
    return TokenRecord(**base)  # type: ignore[arg-type]


def test_a_token_carries_its_id_and_256_random_bits() -> None:
    assert TOKEN.startswith("thaw_0123456789abcdef_")
    assert token_id_of(TOKEN) == "0123456789abcdef"
    assert len(TOKEN.rsplit("_", 1)[1]) == 43  # 32 bytes, base64url without padding
    with pytest.raises(ValueError):
        make_token("0123456789abcdef", b"short")


def test_a_stored_token_authenticates_as_its_scope() -> None:
    principal = check_stored(TOKEN, record(), now=200.0)
    assert principal == Principal("0123456789abcdef", admin=False, apps=frozenset({"hello"}))
    assert isinstance(principal, Principal)
    assert principal.may_act_on("hello") and not principal.may_act_on("other")


@pytest.mark.parametrize(("fields", "reason"), [
    ({"revoked_at": 150.0}, "revoked"),
    ({"expires_at": 200.0}, "expired"),
    ({"hash": token_hash(TOKEN + "x")}, "wrong secret"),
])
def test_a_revoked_expired_or_mismatched_token_is_refused(fields: dict[str, object],
                                                          reason: str) -> None:
    refused = check_stored(TOKEN, record(**fields), now=200.0)
    assert refused == Refused("0123456789abcdef", reason)


def test_an_unknown_token_is_refused_naming_only_its_id() -> None:
    assert check_stored(TOKEN, None, now=0.0) == Refused("0123456789abcdef", "unknown token")
    assert check_stored("garbage", None, now=0.0) == Refused("?", "unknown token")


def test_the_bootstrap_token_is_an_admin_known_by_its_hash_only() -> None:
    boot = "x" * 40
    assert check_bootstrap(boot, token_hash(boot)) == Principal(BOOTSTRAP_ID, admin=True)
    assert check_bootstrap(boot + "y", token_hash(boot)) is None
    assert check_bootstrap(boot, "") is None  # no bootstrap token configured


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None), ("Bearer", None),
    ("", None), (None, None), ("Bearer " + "a" * 600, None),
])
def test_only_a_bearer_authorization_header_yields_a_token(header: str | None,
                                                           token: str | None) -> None:
    assert bearer_of(header) == token
