"""A worker and a machine are each described once: every view of one (the heartbeat, the
agent's answers, placement's API) is the shared facts plus its own fields, so a fact is
named, typed and documented in one place (ground/registry/types.py)."""

from __future__ import annotations

import msgspec

from agent.api import MachineView, StatusView
from ground.registry.types import (
    MachineFacts,
    MachineRecord,
    WorkerFacts,
    WorkerStatus,
    facts_of,
)
from placement.api import WorkerView
from placement.core import wake

WORKER_VIEWS = (WorkerStatus, StatusView, WorkerView)
MACHINE_VIEWS = (MachineRecord, MachineView)


def types_of(cls: type[msgspec.Struct]) -> dict[str, object]:
    return {f.name: f.type for f in msgspec.structs.fields(cls)}


def test_every_view_of_a_worker_or_machine_is_its_facts_plus_its_own() -> None:
    for facts, views in ((WorkerFacts, WORKER_VIEWS), (MachineFacts, MACHINE_VIEWS)):
        shared = types_of(facts)
        for view in views:
            assert issubclass(view, facts), view
            own = types_of(view)
            assert {name: own[name] for name in shared} == shared, view  # none redefined


def test_facts_carried_from_one_view_to_another_are_all_kept() -> None:
    status = WorkerStatus(
        id="w1", epoch=7, region="mad", url="http://w1:1", cpus=3.5, memory_mb=2048,
        reserved_cpus=1.5, reserved_memory_mb=512, machines_starting=1, machines_running=2,
        machines=4, draining=True, disk_full=True, pull_blocked="disk below reserve",
        layers={"sha256:a": 10}, updated_at=5.0)
    view = WorkerView(**facts_of(status), layers=1, layer_bytes=10, updated_at=5.0,
                      healthy=False)
    assert facts_of(view) == facts_of(status)
    assert set(facts_of(status)) == set(WorkerFacts.__struct_fields__)
    assert all(value != getattr(WorkerFacts("", 0, "", "", 0, 0), name)
               for name, value in facts_of(status).items())  # each set above, none default
    record = MachineRecord(id="m1", app="a", worker="w1", region="mad", state="started",
                           image_digest="sha256:b", created_at=1.0, updated_at=2.0,
                           address="10.0.0.2:8080", app_uid="u1", release=3, epoch=7)
    assert set(facts_of(record)) == set(MachineFacts.__struct_fields__)
    assert facts_of(record)["release"] == 3 and "epoch" not in facts_of(record)


def test_placements_rules_read_a_machine_by_its_facts() -> None:
    assert wake.Machine is MachineFacts
