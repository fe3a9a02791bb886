"""Two placements as separate processes on one Redis judge a worker together: edges'
reports heard by either count, and a worker either one marks failed is failed for both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.agent_process import call, wait_until
from tests.support.credentials import ADMIN_TOKEN
from tests.support.redis_server import start_redis_server
from tests.support.services import Services

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    tmp = tmp_path_factory.mktemp("failures")
    with start_redis_server() as redis:
        services = Services(tmp, redis.url, agents=2, placements=2).start()
        try:
            for api in services.apis:
                wait_until(lambda api=api: len(workers(api)) == 2, 20)
            yield services
        finally:
            services.stop()


def workers(api: str) -> dict[str, dict[str, Any]]:
    status, body = call("GET", f"{api}/v1/workers", token=ADMIN_TOKEN)
    assert status == 200, body
    return {w["id"]: w for w in body}


def suspect(api: str, worker: str, reporter: str, machine: str) -> dict[str, Any]:
    status, body = call("POST", f"{api}/internal/workers/{worker}/suspect",
                        {"reporter": reporter, "machine": machine,
                         "address": "127.0.0.1:1", "error": "ConnectionRefusedError(111)"})
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def test_two_edges_reports_through_two_placements_fail_the_worker_for_both(
    services: Services,
) -> None:
    first, second = services.apis
    # each placement hears one edge about one machine: alone, neither would judge
    assert suspect(first, "w1", "edge-a", "m1")["failed"] is False  # its agent answers
    answer = suspect(second, "w1", "edge-b", "m2")
    assert answer["failed"] is True and "two edges" in answer["reason"], answer
    # the mark reaches the placement that did not make it within its poll
    wait_until(lambda: workers(first)["w1"]["healthy"] is False, 5, 0.1)
    assert "two edges" in workers(first)["w1"]["failed"]
    assert workers(first)["w0"]["healthy"] is True
    # one more report is not news to either
    assert suspect(first, "w1", "edge-c", "m3")["failed"] is True
