"""The egress policy on real sockets: refused targets are never connected to, and say so plainly.

Every refusal is checked two ways: the ImageError code, and a listening socket on
the address the pull would have reached (where that is on loopback) that must
accept no connection. Messages must name the registry as the owner wrote it,
never a URL, an address or an upstream body.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from imagecache.adapters.egress import CheckedResolver, EgressRefused
from imagecache.cache import ImageCache
from imagecache.core.egress import EgressPolicy
from imagecache.errors import ImageError
from imagecache.resolver import ImageResolver
from tests.support import docker_registry as registry_support
from tests.support.docker_registry import DockerRegistry
from tests.support.egress import StubLookup, Trap
from tests.support.ports import free_port
from tests.support.registry_proxy import RegistryProxy
from thaw.imagebuild import BuildOverrides, build_image

pytestmark = pytest.mark.integration
docker_registry = registry_support.docker_registry  # the session fixture, by name

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
# examples/hello without its python base: these tests are about the cache's pulls
SCRATCH = BuildOverrides(base="scratch")
GIB = 1024**3


Attempt = Callable[[str, EgressPolicy, StubLookup], Awaitable[object]]


async def _pull(ref: str, policy: EgressPolicy, lookup: StubLookup, root: Path) -> object:
    cache = ImageCache(root, budget_bytes=GIB, policy=policy, lookup=lookup, http_timeout_s=2)
    try:
        return await cache.pull(ref)
    finally:
        await cache.close()


async def _resolve(ref: str, policy: EgressPolicy, lookup: StubLookup) -> object:
    resolver = ImageResolver(policy, lookup=lookup, http_timeout_s=2, resolve_timeout_s=5)
    try:
        return await resolver.resolve(ref)
    finally:
        await resolver.close()


@pytest.fixture(params=["pull", "resolve"])
def attempt(request: pytest.FixtureRequest, tmp_path: Path) -> Attempt:
    """Both ways in: ImageCache.pull and ImageResolver.resolve."""
    if request.param == "pull":
        return lambda ref, policy, lookup: _pull(ref, policy, lookup, tmp_path / "cache")
    return _resolve


async def _refused(attempt: Attempt, ref: str, policy: EgressPolicy, lookup: StubLookup) -> str:
    """Run the attempt; it must fail with forbidden_host and a message free of URLs."""
    with pytest.raises(ImageError) as caught:
        await attempt(ref, policy, lookup)
    assert caught.value.code == "forbidden_host", caught.value
    assert "http://" not in str(caught.value) and "https://" not in str(caught.value)
    return caught.value.message


@pytest.fixture(scope="module")
def hello_digest(docker_registry: DockerRegistry) -> str:
    return build_image(HELLO, "hello:v1", push=docker_registry.url, overrides=SCRATCH)


@pytest.mark.parametrize(
    ("listen_on", "ref"),
    [
        ("127.0.0.1", "127.0.0.1:{port}/x:v1"),
        ("::1", "[::1]:{port}/x:v1"),
        ("127.0.0.1", "[::ffff:127.0.0.1]:{port}/x:v1"),
    ],
)
async def test_unlisted_loopback_literal_registry_is_refused_and_never_connected_to(
    attempt: Attempt, listen_on: str, ref: str
) -> None:
    lookup = StubLookup()
    async with Trap(listen_on) as listening:
        text = ref.format(port=listening.port)
        message = await _refused(attempt, text, EgressPolicy(), lookup)
        await listening.assert_untouched()
    assert message.startswith(text.split("/")[0])
    assert lookup.asked == []


async def test_registry_name_resolving_to_loopback_is_refused_and_never_connected_to(
    attempt: Attempt, trap: Trap
) -> None:
    lookup = StubLookup({"registry.example.test": ["127.0.0.1"]})
    ref = f"registry.example.test:{trap.port}/x:v1"
    message = await _refused(attempt, ref, EgressPolicy(), lookup)
    await trap.assert_untouched()
    assert lookup.asked == [("registry.example.test", trap.port)]
    assert "127.0.0.1" not in message and "registry.example.test" in message


@pytest.mark.parametrize(
    "ref",
    [
        "10.0.0.1:5000/x:v1",
        "169.254.169.254/x:v1",
        "[::ffff:169.254.169.254]/x:v1",
        "[fe80::1]:5000/x:v1",
        "2130706433:5000/x:v1",
    ],
)
async def test_private_and_metadata_literal_registries_are_refused_before_any_connect(
    attempt: Attempt, ref: str
) -> None:
    # http_timeout_s is 2 s: a connect attempt to 10.0.0.1 would fail as a
    # registry_error (timeout or unreachable), not as forbidden_host.
    lookup = StubLookup()
    await _refused(attempt, ref, EgressPolicy(), lookup)
    assert lookup.asked == []


async def test_listed_only_with_an_empty_list_refuses_a_public_name_without_dns(
    attempt: Attempt,
) -> None:
    lookup = StubLookup({"registry.example.com": ["93.184.216.34"]})
    policy = EgressPolicy.build(listed_only=True)
    message = await _refused(attempt, "registry.example.com/app:v1", policy, lookup)
    assert message == "registry.example.com is not one of the allowed registries"
    assert lookup.asked == []


async def test_default_policy_refuses_the_loopback_test_registry_and_every_layout(
    tmp_path: Path, docker_registry: DockerRegistry
) -> None:
    cache = ImageCache(tmp_path / "cache", budget_bytes=GIB)
    try:
        for ref in (f"{docker_registry.host}/hello:v1", f"oci:{tmp_path}:v1"):
            with pytest.raises(ImageError) as caught:
                await cache.pull(ref)
            assert caught.value.code == "forbidden_host"
    finally:
        await cache.close()


@pytest.mark.parametrize("realm_host", ["127.0.0.1", "auth.example.test"])
async def test_bearer_realm_at_an_unlisted_loopback_address_is_refused_and_never_reached(
    tmp_path: Path, docker_registry: DockerRegistry, trap: Trap, realm_host: str
) -> None:
    lookup = StubLookup({"auth.example.test": ["127.0.0.1"]})
    realm = f"http://{realm_host}:{trap.port}/token"
    async with RegistryProxy(docker_registry.url, require_token=True, realm=realm) as guarded:
        policy = EgressPolicy.build([guarded.host])
        with pytest.raises(ImageError) as caught:
            await _pull(f"{guarded.host}/hello:v1", policy, lookup, tmp_path / "cache")
        await trap.assert_untouched()
    assert caught.value.code == "forbidden_host"
    assert guarded.unauthorized == 1 and guarded.token_requests == []
    message = caught.value.message
    assert message == f"{guarded.host}: token request: the token realm is not an allowed address"
    assert f"{realm_host}:{trap.port}" not in message


@pytest.mark.parametrize("target_host", ["127.0.0.1", "blobs.example.test"])
async def test_redirect_from_a_listed_registry_to_an_unlisted_loopback_port_is_refused(
    tmp_path: Path,
    docker_registry: DockerRegistry,
    hello_digest: str,
    trap: Trap,
    target_host: str,
) -> None:
    lookup = StubLookup({"blobs.example.test": ["127.0.0.1"]})
    away = f"http://{target_host}:{trap.port}"
    async with RegistryProxy(docker_registry.url, redirect_blobs=True, redirect_to=away) as proxy:
        policy = EgressPolicy.build([proxy.host])
        with pytest.raises(ImageError) as caught:
            await _pull(f"{proxy.host}/hello:v1", policy, lookup, tmp_path / "cache")
        await trap.assert_untouched()
    assert caught.value.code == "forbidden_host"
    assert caught.value.message.startswith(f"{proxy.host}: blob sha256:")
    assert caught.value.message.endswith("the redirect from the registry is not an allowed address")
    assert str(trap.port) not in caught.value.message


async def test_credentials_are_not_carried_across_a_redirect_to_another_origin(
    tmp_path: Path, docker_registry: DockerRegistry, hello_digest: str
) -> None:
    async with RegistryProxy(docker_registry.url) as elsewhere:
        away = f"http://{elsewhere.host}"
        async with RegistryProxy(
            docker_registry.url, require_token=True, redirect_blobs=True, redirect_to=away
        ) as guarded:
            policy = EgressPolicy.build([guarded.host, elsewhere.host], listed_only=True)
            image = await _pull(f"{guarded.host}/hello:v1", policy, StubLookup(), tmp_path / "c")
    assert image.digest == hello_digest  # type: ignore[attr-defined]
    assert len(elsewhere.redirected_auth) == 2  # config + layer, both fetched there
    assert elsewhere.redirected_auth == [None, None]


class Redirector:
    """A registry stand-in that answers every GET with a redirect to `location(n)`."""

    def __init__(self, location: Callable[[int], str]) -> None:
        self.location = location
        self.port = free_port()
        self.requests = 0
        self._runner: web.AppRunner | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> Redirector:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._redirect)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _redirect(self, request: web.Request) -> web.Response:
        self.requests += 1
        raise web.HTTPFound(self.location(self.requests))


async def test_more_than_five_redirects_end_the_request_as_a_registry_error(
    attempt: Attempt,
) -> None:
    async with Redirector(lambda n: f"/hop/{n}") as looping:
        policy = EgressPolicy.build([looping.host])
        with pytest.raises(ImageError) as caught:
            await attempt(f"{looping.host}/x:v1", policy, StubLookup())
    assert caught.value.code == "registry_error"
    assert caught.value.message == f"{looping.host}: manifest x:v1: over 5 redirects"
    assert looping.requests == 6


@pytest.mark.parametrize(
    "location", ["file:///etc/passwd", "gopher://127.0.0.1:70/x", "http://169.254.169.254/x"]
)
async def test_redirect_to_another_scheme_or_a_metadata_address_is_refused(
    attempt: Attempt, location: str
) -> None:
    async with Redirector(lambda _: location) as redirecting:
        policy = EgressPolicy.build([redirecting.host])
        message = await _refused(attempt, f"{redirecting.host}/x:v1", policy, StubLookup())
    assert location not in message


async def test_unreachable_and_unresolvable_listed_registries_fail_without_urls_or_addresses(
    attempt: Attempt,
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    lookup = StubLookup()  # knows no name: every lookup fails
    policy = EgressPolicy.build([dead, "nowhere.example.test"])
    for ref, reason in [
        (f"{dead}/x:v1", f"{dead}: manifest x:v1: cannot connect"),
        ("nowhere.example.test/x:v1", "nowhere.example.test: manifest x:v1: name did not resolve"),
    ]:
        with pytest.raises(ImageError) as caught:
            await attempt(ref, policy, lookup)
        assert (caught.value.code, caught.value.message) == ("registry_error", reason)


async def test_checked_resolver_keeps_only_allowed_addresses_and_refuses_when_none_are_left() -> (
    None
):
    lookup = StubLookup({"mixed.example.test": ["127.0.0.1", "93.184.216.34", "10.1.1.1"]})
    resolver = CheckedResolver(EgressPolicy(), lookup)
    found = await resolver.resolve("mixed.example.test", 443, socket.AF_UNSPEC)
    assert [r["host"] for r in found] == ["93.184.216.34"]
    listed = CheckedResolver(EgressPolicy.build(["mixed.example.test"]), lookup)
    found = await listed.resolve("mixed.example.test", 443, socket.AF_UNSPEC)
    assert [r["host"] for r in found] == ["127.0.0.1", "93.184.216.34", "10.1.1.1"]
    lookup.names["inside.example.test"] = ["127.0.0.1", "::1", "169.254.169.254"]
    with pytest.raises(EgressRefused) as caught:
        await resolver.resolve("inside.example.test", 443, socket.AF_UNSPEC)
    assert "169.254.169.254" not in str(caught.value)
