"""Placement's image and host-name rules over its API: references are resolved at create
(never first on a request), private registries are refused before any connection, an
explicitly allowed registry works end to end, and routed names are owned."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagecache.core.egress import EgressPolicy
from tests.support import docker_registry as registry_support
from tests.support.docker_registry import DockerRegistry
from tests.support.egress import StubLookup, Trap
from tests.support.placement_helpers import HELLO, Platform
from tests.support.registry_proxy import RegistryProxy
from thaw.imagebuild import build_image

pytestmark = pytest.mark.integration
docker_registry = registry_support.docker_registry  # the session fixture, by name


@pytest.fixture(scope="module")
def pushed(docker_registry: DockerRegistry) -> str:
    return build_image(HELLO, "hello:v1", push=docker_registry.url)


@pytest.mark.parametrize("ref", [
    "127.0.0.1:{port}/x:v1", "[::1]:{port}/x:v1", "[::ffff:127.0.0.1]:{port}/x:v1",
    "10.0.0.1:{port}/x:v1", "169.254.169.254/latest:v1", "registry.example.test:{port}/x:v1",
    "localhost:{port}/x:v1",
])
async def test_an_image_at_a_private_address_is_422_at_create_and_nothing_is_connected_to(
    tmp_path: Path, trap: Trap, trap6: Trap, ref: str
) -> None:
    lookup = StubLookup({"registry.example.test": ["127.0.0.1"], "localhost": ["127.0.0.1"]})
    async with Platform(tmp_path, agents=0, lookup=lookup) as p:
        image = ref.format(port=trap.port)
        status, body = await p.call("POST", "/v1/apps", {"name": "evil", "image": image})
        assert (status, body.get("field")) == (422, "image"), body
        if "127.0.0.1" not in image:  # names the host as written, never what it resolved to
            assert "127.0.0.1" not in body["message"], body
        assert (await p.call("GET", "/v1/apps/evil"))[0] == 404  # nothing stored
        await trap.assert_untouched()
        await trap6.assert_untouched()


async def test_a_registry_whose_token_realm_is_private_is_refused_at_create(
    tmp_path: Path, docker_registry: DockerRegistry, pushed: str, trap: Trap
) -> None:
    realm = f"http://127.0.0.1:{trap.port}/token"
    async with RegistryProxy(docker_registry.url, require_token=True, realm=realm) as guarded:
        egress = EgressPolicy.build([guarded.host], layout_dirs=[str(tmp_path.parent)])
        async with Platform(tmp_path, agents=0, egress=egress) as p:
            status, body = await p.call("POST", "/v1/apps",
                                        {"name": "app", "image": f"{guarded.host}/hello:v1"})
            assert (status, body.get("field")) == (422, "image"), body
        await trap.assert_untouched()


async def test_an_explicitly_allowed_registry_resolves_at_create_and_its_machine_runs(
    tmp_path: Path, docker_registry: DockerRegistry, pushed: str
) -> None:
    egress = EgressPolicy.build([docker_registry.host], listed_only=True)
    async with Platform(tmp_path, egress=egress) as p:
        created = await p.create_app(name="hello", image=f"{docker_registry.host}/hello:v1",
                                     guest={"cpus": 0.25, "memory_mb": 64},
                                     health={"path": "/healthz", "timeout_s": 15})
        assert created["image_digest"] == pushed  # pinned at create, not on a request
        status, woke = await p.call("POST", "/internal/apps/hello/wake",
                                    {"count": 1, "deadline_ms": 20_000})
        assert status == 200, woke
        machine = woke["machines"][0]
        assert await p.get_text(machine["address"]) == f"hello from {machine['id']}\n"


async def test_an_unresolvable_image_is_424_at_create_and_at_deploy_with_no_internal_url(
    tmp_path: Path, docker_registry: DockerRegistry, pushed: str, hello_layout: str
) -> None:
    egress = EgressPolicy.build([docker_registry.host], layout_dirs=[str(tmp_path.parent)])
    async with Platform(tmp_path, agents=0, egress=egress) as p:
        missing = f"{docker_registry.host}/nothing-here:v1"
        status, body = await p.call("POST", "/v1/apps", {"name": "app", "image": missing})
        assert (status, body["error"]) == (424, "image_unavailable"), body
        assert "http://" not in body["message"]
        await p.create_app(name="app", image=hello_layout)
        status, body = await p.call("POST", "/v1/apps/app/deploy", {"image": missing})
        assert (status, body["error"]) == (424, "image_unavailable"), body
        status, body = await p.call("POST", "/v1/apps/app/deploy", {"image": "Not A Ref"})
        assert (status, body.get("field")) == (422, "image"), body
        status, body = await p.call("PATCH", "/v1/apps/app", {"image": "10.0.0.1/x:v1"})
        assert (status, body.get("field")) == (422, "image"), body
        status, kept = await p.call("GET", "/v1/apps/app")
        assert kept["image"] == hello_layout and kept["image_digest"].startswith("sha256:")


async def test_a_layout_outside_the_allowed_directories_is_422_at_create(
    tmp_path: Path, hello_layout: str
) -> None:
    elsewhere = tmp_path / "allowed"
    elsewhere.mkdir()
    async with Platform(tmp_path, agents=0,
                        egress=EgressPolicy.build(layout_dirs=[str(elsewhere)])) as p:
        status, body = await p.call("POST", "/v1/apps", {"name": "app", "image": hello_layout})
        assert (status, body.get("field")) == (422, "image"), body


# -- host names are owned ------------------------------------------------------------------


@pytest.mark.parametrize("claim", ["www.hello.test", "WWW.Hello.TEST", "www.hello.test.",
                                   "www.hello.test\u3002", "\uff57ww.hello.test"])
async def test_creating_or_patching_an_app_onto_another_apps_host_is_409(
    tmp_path: Path, hello_layout: str, claim: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout, hosts=["www.hello.test"])
        status, body = await p.call("POST", "/v1/apps",
                                    {"name": "evil", "image": hello_layout, "hosts": [claim]})
        assert (status, body["error"], body.get("holder")) == (409, "host_taken", "hello")
        assert (await p.call("GET", "/v1/apps/evil"))[0] == 404  # nothing half-written
        await p.create_app(name="evil", image=hello_layout)
        status, body = await p.call("PATCH", "/v1/apps/evil", {"hosts": [claim]})
        assert (status, body["error"]) == (409, "host_taken"), body
        status, evil = await p.call("GET", "/v1/apps/evil")
        assert evil["hosts"] == [] and evil["version"] == 1
        assert (await p.registry.app("hello")).hosts == ["www.hello.test"]  # type: ignore


@pytest.mark.parametrize("claim", ["www.hello.test..", "www.hello.test\u3002\u3002",
                                   "x.localhost..", "x.localhost\u3002"])
async def test_a_name_with_an_empty_label_or_under_the_domain_in_any_spelling_is_422(
    tmp_path: Path, hello_layout: str, claim: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout, hosts=["www.hello.test"])
        status, body = await p.call("POST", "/v1/apps",
                                    {"name": "evil", "image": hello_layout, "hosts": [claim]})
        assert (status, body.get("field")) == (422, "hosts"), body


async def test_a_409_names_the_holder_only_to_a_caller_who_may_see_it(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout, hosts=["www.hello.test"])
        await p.create_app(name="evil", image=hello_layout)
        status, made = await p.call("POST", "/v1/tokens", {"apps": ["evil"]})
        status, body = await p.call("PATCH", "/v1/apps/evil", {"hosts": ["www.hello.test"]},
                                    token=made["token"])
        assert (status, body["error"]) == (409, "host_taken")
        assert "holder" not in body and "hello" not in body["message"].replace(
            "www.hello.test", "")


async def test_a_name_under_the_platform_domain_cannot_be_listed_and_a_freed_name_can_be(
    tmp_path: Path, hello_layout: str
) -> None:
    async with Platform(tmp_path, agents=0) as p:
        await p.create_app(name="hello", image=hello_layout, hosts=["www.hello.test"])
        for stolen in ("hello.localhost", "HELLO.localhost.", "x.y.localhost", "localhost"):
            status, body = await p.call("POST", "/v1/apps",
                                        {"name": "evil", "image": hello_layout, "hosts": [stolen]})
            assert (status, body.get("field")) == (422, "hosts"), (stolen, body)
        status, _ = await p.call("PATCH", "/v1/apps/hello", {"hosts": []})
        assert status == 200
        created = await p.create_app(name="other", image=hello_layout, hosts=["www.hello.test"])
        assert created["hosts"] == ["www.hello.test"]
        assert (await p.call("DELETE", "/v1/apps/other"))[0] == 200
        await p.create_app(name="third", image=hello_layout, hosts=["Www.Hello.Test"])
