"""Apps' secrets through placement's API: set, listed, unset; bounds and scopes; never a
value answered, stored in clear or published; key rotation at a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ground.auth.sealing import SecretKeys
from placement.store import open_store
from tests.support.credentials import SECRETS_KEY
from tests.support.placement_helpers import Platform

pytestmark = pytest.mark.integration
VALUE = "s3cret-value-0f9e8d7c6b5a"
NEW_KEY = "rotated-secrets-key-" + "n" * 32


async def made(p: Platform, hello_layout: str) -> None:
    await p.create_app(name="hello", image=hello_layout, env={"PLAIN": "visible"})


async def test_setting_a_secret_is_a_release_and_no_answer_or_record_holds_its_value(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await made(p, hello_layout)
        status, body = await p.call("POST", "/v1/apps/hello/secrets",
                                    {"secrets": {"DB_PASSWORD": VALUE}})
        assert status == 200 and body["release"] == 2, body
        [shown] = body["secrets"]
        assert shown["name"] == "DB_PASSWORD" and len(shown["digest"]) == 12
        answers = [body]
        for path in ("/v1/apps/hello", "/v1/apps/hello/secrets", "/v1/apps/hello/releases",
                     "/v1/apps/hello/events", "/v1/apps"):
            status, answer = await p.call("GET", path)
            assert status == 200
            answers.append(answer)
        assert answers[1]["secrets"] == {"DB_PASSWORD": shown["digest"]}
        assert answers[3][0]["version"] == 2
        published = await p.registry.app("hello")
        assert published is not None and published.secrets == answers[1]["secrets"]
        assert VALUE not in json.dumps(answers) + repr(published)
        status, again = await p.call("POST", "/v1/apps/hello/secrets",
                                     {"secrets": {"DB_PASSWORD": VALUE}})
        assert status == 200 and again["release"] is None  # the same value: no change
        status, gone = await p.call("DELETE", "/v1/apps/hello/secrets/DB_PASSWORD")
        assert status == 200 and gone["release"] == 3 and gone["secrets"] == []
        assert (await p.call("GET", "/v1/apps/hello"))[1]["secrets"] == {}
    for path in (tmp_path / "placement").iterdir():  # the SQLite file, its WAL
        assert VALUE.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(("body", "field"), [
    ({"secrets": {"1BAD": "x"}}, "secrets"),
    ({"secrets": {"A-B": "x"}}, "secrets"),
    ({"secrets": {"PORT": "x"}}, "secrets"),
    ({"secrets": {"THAW_APP": "x"}}, "secrets"),
    ({"secrets": {"PLAIN": "x"}}, "secrets"),
    ({"secrets": {"A": "x" * (32 * 1024 + 1)}}, "secrets"),
    ({"secrets": {f"S{i}": "x" for i in range(101)}}, "secrets"),
    ({"secrets": {"A": 1}}, "secrets"),
    ({"secret": {"A": "x"}}, "secret"),
    ({"secrets": {"A": "x"}, "unset": ["A"]}, "unset"),
])
async def test_a_refused_change_is_422_naming_the_field_and_never_echoes_a_value(
    tmp_path: Path, hello_layout: str, body: dict[str, object], field: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await made(p, hello_layout)
        status, answer = await p.call("POST", "/v1/apps/hello/secrets", body)
        assert status == 422 and answer["field"] == field, answer
        assert "x" * 64 not in json.dumps(answer)
        assert (await p.call("GET", "/v1/apps/hello"))[1]["release"] == 1


async def test_unknown_apps_secrets_other_scopes_and_env_collisions_are_refused(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await made(p, hello_layout)
        await p.create_app(name="other", image=hello_layout)
        status, other = await p.call("POST", "/v1/tokens", {"apps": ["other"]})
        assert status == 201
        for method, path, body in (("GET", "/v1/apps/hello/secrets", None),
                                   ("POST", "/v1/apps/hello/secrets", {"secrets": {"A": "1"}}),
                                   ("DELETE", "/v1/apps/hello/secrets/A", None)):
            assert (await p.call(method, path, body, token=other["token"]))[0] == 404
            assert (await p.call(method, path.replace("hello", "nope"), body))[0] == 404
        assert (await p.call("POST", "/v1/apps/other/secrets", {"secrets": {"A": "1"}},
                             token=other["token"]))[0] == 200
        status, body = await p.call("DELETE", "/v1/apps/hello/secrets/MISSING")
        assert status == 404 and "MISSING" in body["message"]
        assert (await p.call("DELETE", "/v1/apps/hello/secrets/not-a-name"))[0] == 422
        await p.call("POST", "/v1/apps/hello/secrets", {"secrets": {"TOKEN": "t"}})
        status, body = await p.call("PATCH", "/v1/apps/hello", {"env": {"TOKEN": "plain"}})
        assert status == 422 and body["field"] == "env"
        status, body = await p.call("PATCH", "/v1/apps/hello", {"secrets": {}})
        assert status == 200 and body["secrets"] != {}  # placement's own: not patched


async def test_without_a_secrets_key_a_change_is_refused_and_says_how_to_enable_it(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0, secret_keys=None) as p:
        await made(p, hello_layout)
        status, body = await p.call("POST", "/v1/apps/hello/secrets", {"secrets": {"A": "1"}})
        assert status == 409 and body["error"] == "secrets_disabled"
        assert "--secrets-key-file" in body["message"]
        assert (await p.call("GET", "/v1/apps/hello/secrets")) == (200, [])


async def test_a_restart_with_a_new_first_key_re_encrypts_so_the_old_key_can_go(
    tmp_path: Path, hello_layout: str
) -> None:
    old, both = SecretKeys.parse(SECRETS_KEY), SecretKeys.parse(f"{NEW_KEY}\n{SECRETS_KEY}")
    async with Platform(tmp_path, agents=0, secret_keys=old) as p:
        await made(p, hello_layout)
        await p.call("POST", "/v1/apps/hello/secrets", {"secrets": {"A": "1", "B": "2"}})
        digests = (await p.call("GET", "/v1/apps/hello/secrets"))[1]
    async with Platform(tmp_path, agents=0, secret_keys=both):
        pass  # started: re-encrypted under the first key
    store = await open_store("sqlite", tmp_path / "placement")
    try:
        uid = (await store.apps.get("hello")).uid
        assert {s.key_id for s in await store.apps.secrets(uid)} == {both.primary_id}
    finally:
        await store.close()
    async with Platform(tmp_path, agents=0, secret_keys=SecretKeys.parse(NEW_KEY)) as p:
        assert (await p.call("GET", "/v1/apps/hello/secrets"))[1] == digests  # unchanged
        status, body = await p.call("POST", "/v1/apps/hello/secrets",
                                    {"secrets": {"A": "1", "C": "3"}})  # A decrypts: same
        assert status == 200 and [s["name"] for s in body["secrets"]] == ["A", "B", "C"]
        assert body["secrets"][0] == digests[0]
