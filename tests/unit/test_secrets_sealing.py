"""Secrets' cryptography (ground/auth/sealing.py) and the plan of a change of an app's
secrets (placement/core/secrets.py): pure, no event loop."""

from __future__ import annotations

import hashlib
import io

import pytest

from ground.appconfig import MAX_SECRETS, InvalidConfig
from ground.auth.sealing import (
    SecretKeys,
    Unsealable,
    decrypt_value,
    digest,
    encrypt_value,
    seal_env,
    unseal_env,
)
from ground.auth.signing import KeyRing
from placement.core.secrets import MAX_SECRET_VALUE_BYTES, UnknownSecret, plan_secrets
from thaw.cmd_secrets import secret_pairs

OLD, NEW = "a" * 64, "b" * 64
UID = "00000000000000a1"
NONCE = bytes(range(12))


def keys(*texts: str) -> SecretKeys:
    return SecretKeys.parse("\n".join(texts))


def test_a_value_encrypted_at_rest_decrypts_only_for_its_app_and_name() -> None:
    ciphertext, kid = encrypt_value(keys(OLD), UID, "DB_PASSWORD", "hunter2", NONCE)
    assert b"hunter2" not in ciphertext
    assert decrypt_value(keys(OLD), UID, "DB_PASSWORD", ciphertext, NONCE, kid) == "hunter2"
    for uid, name in ((UID, "API_KEY"), ("00000000000000b2", "DB_PASSWORD")):
        with pytest.raises(Unsealable):
            decrypt_value(keys(OLD), uid, name, ciphertext, NONCE, kid)
    altered = bytes([ciphertext[0] ^ 1]) + ciphertext[1:]
    with pytest.raises(Unsealable):
        decrypt_value(keys(OLD), UID, "DB_PASSWORD", altered, NONCE, kid)


def test_after_a_rotation_the_new_key_encrypts_and_the_old_one_still_decrypts() -> None:
    old_ciphertext, old_kid = encrypt_value(keys(OLD), UID, "X", "v", NONCE)
    ring = keys(NEW, OLD)
    new_ciphertext, new_kid = encrypt_value(ring, UID, "X", "v", NONCE)
    assert new_kid == ring.primary_id != old_kid
    assert decrypt_value(ring, UID, "X", old_ciphertext, NONCE, old_kid) == "v"
    with pytest.raises(Unsealable, match=old_kid):  # the old key dropped too early
        decrypt_value(keys(NEW), UID, "X", old_ciphertext, NONCE, old_kid)
    assert decrypt_value(keys(NEW), UID, "X", new_ciphertext, NONCE, new_kid) == "v"


def test_a_digest_is_keyed_bound_to_app_and_name_and_says_nothing_of_a_plain_hash() -> None:
    shown = digest(keys(OLD), UID, "PIN", "1234")
    assert len(shown) == 12 and int(shown, 16) >= 0
    assert shown == digest(keys(OLD), UID, "PIN", "1234")
    assert shown not in hashlib.sha256(b"1234").hexdigest()
    others = {digest(keys(NEW), UID, "PIN", "1234"), digest(keys(OLD), "00000000000000b2",
              "PIN", "1234"), digest(keys(OLD), UID, "CODE", "1234"),
              digest(keys(OLD), UID, "PIN", "1235")}
    assert shown not in others and len(others) == 4


def test_sealed_env_opens_only_for_its_app_uid_and_release_with_a_cluster_key() -> None:
    ring = KeyRing.parse(OLD)
    sealed = seal_env(ring, "hello", UID, 3, {"DB_PASSWORD": "hunter2"}, NONCE)
    assert "hunter2" not in sealed and sealed.startswith("v1.")
    assert unseal_env(ring, "hello", UID, 3, sealed) == {"DB_PASSWORD": "hunter2"}
    for app, uid, release in (("other", UID, 3), ("hello", "00000000000000b2", 3),
                              ("hello", UID, 4)):
        with pytest.raises(Unsealable):
            unseal_env(ring, app, uid, release, sealed)
    assert unseal_env(KeyRing.parse(f"{NEW}\n{OLD}"), "hello", UID, 3, sealed)  # rotation
    with pytest.raises(Unsealable, match="not in this agent's ring"):
        unseal_env(KeyRing.parse(NEW), "hello", UID, 3, sealed)
    for garbage in ("v1.x.y", "v2." + sealed[3:], sealed[:-4] + "AAAA", "v1"):
        with pytest.raises(Unsealable):
            unseal_env(ring, "hello", UID, 3, garbage)
    assert seal_env(ring, "hello", UID, 3, {}, NONCE) == "" and \
        unseal_env(ring, "hello", UID, 3, "") == {}


def test_a_secrets_key_file_is_refused_empty_short_repeated_or_with_too_many_keys() -> None:
    for text, why in (("", "no secrets key"), ("short", "at least 32"),
                      (f"{OLD}\n{OLD}", "twice"), ("\n".join(c * 40 for c in "abcde"),
                                                   "at most 4")):
        with pytest.raises(ValueError, match=why):
            SecretKeys.parse(text)
    assert keys(NEW, OLD).by_id(keys(OLD).primary_id) == OLD.encode()


def test_a_change_sets_new_or_changed_values_and_drops_unset_names_only() -> None:
    plan = plan_secrets({"A": "1", "B": "2"}, {"A": "1", "C": "3"}, ["B"], {"PLAIN": "x"})
    assert plan.put == {"C": "3"} and plan.drop == ("B",) and plan.changed
    assert not plan_secrets({"A": "1"}, {"A": "1"}, [], {}).changed


@pytest.mark.parametrize(("put", "unset", "field", "why"), [
    ({"PORT": "1"}, [], "secrets", "set by the platform"),
    ({"THAW_APP": "1"}, [], "secrets", "set by the platform"),
    ({"HOSTNAME": "x"}, [], "secrets", "set by the platform"),
    # read before the app: a bad one fails every start, and a rollback keeps secrets
    ({"PATH": "/evil"}, [], "secrets", "read by the runtime"),
    ({"HOME": "/evil"}, [], "secrets", "read by the runtime"),
    ({"LD_PRELOAD": "/tmp/x"}, [], "secrets", "read by the runtime"),
    ({"PYTHONPATH": "/tmp"}, [], "secrets", "read by the runtime"),
    ({"PLAIN": "1"}, [], "secrets", "in the app's env"),
    ({"A": "a\0b"}, [], "secrets", "NUL"),
    ({"A": "é" * MAX_SECRET_VALUE_BYTES}, [], "secrets", "at most"),
    ({"A": "1"}, ["A"], "unset", "also set"),
    ({f"S{i}": "1" for i in range(MAX_SECRETS + 1)}, [], "secrets", "at most"),
    ({f"S{i}": "x" * 30_000 for i in range(3)}, [], "secrets", "bytes of names and values"),
])
def test_a_refused_change_names_its_field(put: dict[str, str], unset: list[str], field: str,
                                          why: str) -> None:
    with pytest.raises(InvalidConfig, match=why) as caught:
        plan_secrets({"A": "0"}, put, unset, {"PLAIN": "x"})
    assert caught.value.field == field
    assert "\0" not in str(caught.value) and "x" * 100 not in str(caught.value)


def test_unsetting_a_name_the_app_does_not_have_is_an_unknown_secret() -> None:
    with pytest.raises(UnknownSecret):
        plan_secrets({"A": "1"}, {}, ["B"], {})


def test_the_cli_reads_one_value_from_stdin_and_never_echoes_a_value_it_refuses() -> None:
    assert secret_pairs(["A=x=y", "B=-", "C="], io.StringIO("from stdin\n")) == {
        "A": "x=y", "B": "from stdin", "C": ""}
    with pytest.raises(InvalidConfig, match="only one"):
        secret_pairs(["A=-", "B=-"], io.StringIO("v"))
    for bad in (["1A=hunter2"], ["NOEQUALS"], ["A=1", "A=2"]):
        with pytest.raises(InvalidConfig) as caught:
            secret_pairs(bad, io.StringIO())
        assert "hunter2" not in str(caught.value)
