"""Signed internal calls: what a verifier accepts and refuses (pure: time is an argument)."""

from __future__ import annotations

import pytest

from ground.auth.signing import KeyRing, Unsigned, Verifier, sign

OLD = "o" * 40
NEW = "n" * 40
NOW = 1_700_000_000.0


def signed(ring: KeyRing, *, method: str = "POST", host: str = "127.0.0.1:7001",
           target: str = "/v1/offers?x=1", body: bytes = b'{"a":1}', now: float = NOW,
           nonce: str = "ab" * 16) -> str:
    return sign(ring, method, host, target, body, now, nonce)


def check(verifier: Verifier, header: str | None, *, method: str = "POST",
          host: str = "127.0.0.1:7001", target: str = "/v1/offers?x=1",
          body: bytes = b'{"a":1}', now: float = NOW) -> Unsigned | None:
    return verifier.verify(header, method, host, target, body, now)


def test_a_signed_call_is_accepted_once_and_its_replay_is_refused() -> None:
    ring = KeyRing.parse(NEW)
    verifier = Verifier(ring)
    header = signed(ring)
    assert check(verifier, header) is None
    assert check(verifier, header, now=NOW + 1) == Unsigned("replayed signature")


def test_two_identical_calls_with_different_nonces_are_both_accepted() -> None:
    ring = KeyRing.parse(NEW)
    verifier = Verifier(ring)
    assert check(verifier, signed(ring, nonce="01" * 16)) is None
    assert check(verifier, signed(ring, nonce="02" * 16)) is None


@pytest.mark.parametrize("change", [
    {"method": "DELETE"}, {"host": "127.0.0.1:7002"}, {"target": "/v1/offers?x=2"},
    {"target": "/v1/offers"}, {"body": b'{"a":2}'},
])
def test_any_change_to_what_was_signed_is_refused(change: dict[str, object]) -> None:
    ring = KeyRing.parse(NEW)
    refused = check(Verifier(ring), signed(ring), **change)  # type: ignore[arg-type]
    assert refused == Unsigned("bad signature")


@pytest.mark.parametrize("skew_s", [-31.0, 31.0, 3600.0])
def test_a_signature_outside_30_seconds_is_refused(skew_s: float) -> None:
    ring = KeyRing.parse(NEW)
    refused = check(Verifier(ring), signed(ring, now=NOW - skew_s))
    assert refused is not None and "outside" in refused.reason


def test_during_rotation_the_previous_key_is_accepted_and_a_removed_one_is_not() -> None:
    rotating = Verifier(KeyRing.parse(f"{NEW}\n{OLD}"))
    assert check(rotating, signed(KeyRing.parse(OLD))) is None
    assert check(rotating, signed(KeyRing.parse(NEW))) is None
    after = Verifier(KeyRing.parse(NEW))
    refused = check(after, signed(KeyRing.parse(OLD), nonce="cd" * 16))
    assert refused is not None and refused.reason.startswith("unknown key id")


def test_a_call_signed_for_another_audience_is_refused() -> None:
    ring = KeyRing.parse(NEW)
    verifier = Verifier(ring, audiences=["127.0.0.1:7002"])
    refused = check(verifier, signed(ring, host="127.0.0.1:7001"))
    assert refused is not None and "not for this service" in refused.reason


@pytest.mark.parametrize("header", [None, "", "sig=abc", "kid=zz,ts=1,nonce=ab,sig=cd"])
def test_a_missing_or_malformed_signature_is_refused(header: str | None) -> None:
    assert check(Verifier(KeyRing.parse(NEW)), header) is not None


def test_a_full_replay_cache_refuses_rather_than_forgetting_a_live_signature() -> None:
    ring = KeyRing.parse(NEW)
    verifier = Verifier(ring, replay_capacity=2)
    assert check(verifier, signed(ring, nonce="01" * 16)) is None
    assert check(verifier, signed(ring, nonce="02" * 16)) is None
    assert check(verifier, signed(ring, nonce="03" * 16)) == Unsigned("replay cache full")
    # once the first ones are past the window they make room again
    later = NOW + 62
    assert check(verifier, signed(ring, nonce="04" * 16, now=later), now=later) is None


@pytest.mark.parametrize("text", ["", "short", f"{NEW},{OLD},{'x' * 40}"])
def test_a_key_ring_needs_one_or_two_long_keys(text: str) -> None:
    with pytest.raises(ValueError):
        KeyRing.parse(text)


def test_a_signature_made_before_the_verifier_started_is_refused() -> None:
    """The replay cache starts empty at a restart: what was signed before it is refused."""
    ring = KeyRing.parse(NEW)
    header = signed(ring, now=NOW - 5)
    restarted = Verifier(ring, not_before=NOW - 1)
    refused = check(restarted, header)
    assert refused is not None and "before this service started" in refused.reason
    assert check(restarted, signed(ring, now=NOW, nonce="ef" * 16)) is None
