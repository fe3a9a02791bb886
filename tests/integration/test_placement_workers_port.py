"""The `Workers` port's contract (placement/ports/workers.py), run on each backend: over HTTP
against a real agent (`HttpWorkers`), and from memory (tests/support/memory_workers.py,
what unit tests use). Every answer typed — what was asked for, `Refused` with the
agent's code and message, or `Unreachable` naming the call and not the worker — and
nothing else escapes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.api import HealthView, MachineGone, MachineView, OfferRequest, PulledImage
from agent.core.records import Guest
from placement.adapters.agents import AgentClient, HttpWorkers, fenced_by
from placement.ports.workers import LogChunk, Refused, Unreachable, Workers
from tests.support.agent_process import AgentProcess
from tests.support.credentials import SIGNER
from tests.support.memory_workers import MemoryWorkers
from tests.support.ports import free_port

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def image(hello_layout: str) -> str:  # (tests/conftest.py's: examples/hello as a layout)
    return hello_layout


@pytest.fixture(params=["http", "memory"])
def agent_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of one worker of 1 cpu and 512 MB: a real agent's, or "" for memory."""
    if request.param == "memory":
        yield ""
        return
    with AgentProcess(tmp_path / "agent", cpus=1, memory_mb=512) as proc:  # (sync: it
        yield proc.url  # sweeps what its machines left with asyncio.run)


@pytest.fixture
async def port(agent_url: str) -> AsyncIterator[tuple[Workers, str]]:
    """A backend of the port, and its worker's URL."""
    if not agent_url:
        workers = MemoryWorkers()
        yield workers, workers.add("w1", cpus=1, memory_mb=512)
        return
    client = AgentClient(10.0, SIGNER)
    try:
        yield HttpWorkers(client), agent_url
    finally:
        await client.close()


def offer(image: str, key: str, **fields: object) -> OfferRequest:
    return OfferRequest(key=key, app="hello", image=image,
                        guest=Guest(cpus=0.5, memory_mb=128), **fields)  # type: ignore[arg-type]


async def test_a_machine_offered_started_stopped_and_destroyed_answers_typed_views(
    port: tuple[Workers, str], image: str,
) -> None:
    workers, url = port
    made = await workers.offer(url, offer(image, "k1", start=False))
    assert isinstance(made, MachineView) and made.app == "hello", made
    again = await workers.offer(url, offer(image, "k1", start=False))  # idempotent by key
    assert isinstance(again, MachineView) and again.id == made.id
    pulled = await workers.pull(url, image, 60.0)
    assert isinstance(pulled, PulledImage) and pulled.digest.startswith("sha256:")
    assert pulled.layers and all(layer.size > 0 for layer in pulled.layers)
    started = await workers.start(url, made.id, 30.0, 35.0)
    assert isinstance(started, MachineView) and started.state == "started", started
    assert started.address and any(e.state == "started" for e in started.events)
    listed = await workers.machines(url, "hello")
    assert isinstance(listed, list) and [m.id for m in listed] == [made.id]
    read = await workers.machine(url, made.id)
    assert isinstance(read, MachineView) and read.state == "started"
    waited = await workers.wait(url, made.id, "started", 5.0)
    assert isinstance(waited, MachineView) and waited.id == made.id
    log = await workers.logs(url, made.id, -1, 4096)
    assert isinstance(log, LogChunk) and log.start >= 0
    stopped = await workers.stop(url, made.id)
    assert isinstance(stopped, MachineView) and stopped.state in ("stopping", "stopped")
    gone = await workers.destroy(url, made.id)
    assert isinstance(gone, MachineView) and gone.id == made.id
    destroyed = await workers.wait(url, made.id, "destroyed", 20.0)
    assert destroyed == MachineGone(made.id, "destroyed"), destroyed


async def test_refusals_carry_the_agents_code_and_message(
    port: tuple[Workers, str], image: str,
) -> None:
    workers, url = port
    unknown = await workers.start(url, "0123456789abcdef", 1.0, 5.0)
    assert isinstance(unknown, Refused) and unknown.gone() and unknown.code == "not_found"
    big = await workers.offer(url, OfferRequest(key="k2", app="hello", image=image,
                                                guest=Guest(cpus=8, memory_mb=128)))
    assert isinstance(big, Refused) and big.declined() and big.status == 409, big
    assert big.message  # the agent's own words
    made = await workers.offer(url, offer(image, "k3", start=False))
    assert isinstance(made, MachineView)
    with fenced_by(5):
        assert isinstance(await workers.stop(url, made.id), Refused)  # not started
    with fenced_by(3):  # a token older than one the agent has seen for the app
        stale = await workers.destroy(url, made.id)
    assert isinstance(stale, Refused) and stale.code == "stale_fence", stale
    health = await workers.health(url, 2.0)
    assert isinstance(health, HealthView) and health.ok and health.epoch >= 1


async def test_no_agent_is_unreachable_naming_the_call_not_the_worker(
    port: tuple[Workers, str],
) -> None:
    workers, _ = port
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens
    for answer in (await workers.health(url, 1.0), await workers.machines(url, "hello"),
                   await workers.destroy(url, "0123456789abcdef")):
        assert isinstance(answer, Unreachable), answer
        assert "127.0.0.1" not in answer.message and "did not answer" in answer.message
