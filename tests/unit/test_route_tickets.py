"""Route tickets and seals (ground/auth/tickets.py), the edge's guard (edge/routeguard.py) and
the view ignoring what the guard refuses."""

from __future__ import annotations

import logging

import msgspec
import pytest

from edge.routeguard import RouteGuard
from edge.view import View
from ground.appconfig import parse
from ground.auth import tickets
from ground.auth.secrets_files import route_keys
from ground.auth.tickets import BAD_SEAL, NO_SEAL, RecordCheck, RouteKeys
from ground.registry.types import MachineRecord

KEY = "route-key-" + "a" * 32
OLD = "route-key-" + "b" * 32
KEYS = RouteKeys.parse(KEY)
UID = "0123456789abcdef"


def record(machine: str = "m1", worker: str = "w1", address: str = "10.0.0.5:8080",
           state: str = "started", uid: str = UID, updated_at: float = 50.25) -> MachineRecord:
    return MachineRecord(id=machine, app="hello", worker=worker, region="local", state=state,
                         image_digest="", created_at=1.0, updated_at=updated_at,
                         address=address, app_uid=uid)


def sealed(r: MachineRecord, keys: RouteKeys = KEYS, *, uid: str = "", machine: str = "",
           worker: str = "") -> MachineRecord:
    """`r` sealed by the worker holding the ticket of (uid, machine, worker) (r's own by
    default)."""
    ticket = tickets.ticket(keys, uid or r.app_uid, machine or r.id, worker or r.worker)
    return msgspec.structs.replace(r, seal=tickets.seal_record(ticket, r))


def test_a_record_sealed_with_its_own_ticket_verifies() -> None:
    assert tickets.refusal(KEYS, sealed(record())) is None


def test_a_ticket_is_short_url_safe_and_depends_on_app_machine_and_worker() -> None:
    made = tickets.ticket(KEYS, UID, "m1", "w1")
    assert len(made) == 22 and made.replace("-", "").replace("_", "").isalnum()
    others = {tickets.ticket(KEYS, "f" * 16, "m1", "w1"), tickets.ticket(KEYS, UID, "m2", "w1"),
              tickets.ticket(KEYS, UID, "m1", "w2"), tickets.ticket(KEYS, UID, "m1w", ""),
              tickets.ticket(RouteKeys.parse(OLD), UID, "m1", "w1")}
    assert made not in others and len(others) == 5


@pytest.mark.parametrize("field", ["uid", "machine", "worker"])
def test_a_seal_made_with_the_ticket_of_another_app_machine_or_worker_fails(
        field: str) -> None:
    """A worker holds tickets of the machines placed on it only: sealed with one of
    those, a record of another app's (or another worker's) machine does not verify."""
    other = {"uid": "f" * 16, "machine": "m9", "worker": "w9"}[field]
    forged = sealed(record(), **{field: other})
    assert tickets.refusal(KEYS, forged) == BAD_SEAL


def test_another_workers_seal_copied_onto_another_address_or_state_fails() -> None:
    genuine = sealed(record())
    for changed in (msgspec.structs.replace(genuine, address="6.6.6.6:80"),
                    msgspec.structs.replace(genuine, state="stopped"),
                    msgspec.structs.replace(genuine, updated_at=51.0),
                    msgspec.structs.replace(genuine, worker="w2")):
        assert tickets.refusal(KEYS, changed) == BAD_SEAL


def test_a_record_without_a_seal_is_refused_as_unsealed() -> None:
    assert tickets.refusal(KEYS, record()) == NO_SEAL


def test_a_seal_survives_a_json_round_trip_of_the_record() -> None:
    genuine = sealed(record(updated_at=1718000000.123456789))
    again = msgspec.json.decode(msgspec.json.encode(genuine), type=MachineRecord)
    assert tickets.refusal(KEYS, again) is None


def test_rotation_a_ring_makes_tickets_with_its_first_key_and_verifies_with_each() -> None:
    old_ring, ring = RouteKeys.parse(OLD), RouteKeys.parse(f"{KEY}\n{OLD}")
    by_old = sealed(record(), old_ring)
    assert tickets.refusal(ring, by_old) is None
    assert tickets.refusal(KEYS, by_old) == BAD_SEAL  # the old key dropped: refused
    assert tickets.ticket(ring, UID, "m1", "w1") == tickets.ticket(KEYS, UID, "m1", "w1")


@pytest.mark.parametrize("text, message", [
    ("", "no route key"), ("short", "at least 32"), (f"{KEY},{OLD},{KEY}x", "at most 2")])
def test_route_keys_that_are_missing_short_or_too_many_are_refused(text: str,
                                                                   message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouteKeys.parse(text)


def test_route_keys_come_from_the_flag_else_the_file_the_environment_names(tmp_path) -> None:
    path = tmp_path / "route.key"
    path.touch(mode=0o600)
    path.write_text(KEY + "\n")
    assert route_keys(path, {}) == KEYS
    assert route_keys(None, {"THAW_ROUTE_KEY_FILE": str(path)}) == KEYS
    assert route_keys(None, {}) is None
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        route_keys(path, {})


def test_the_check_judges_each_distinct_record_once_and_without_keys_admits_all() -> None:
    check = RecordCheck(KEYS, capacity=2)
    forged = record()
    first, again = check.judge(forged), check.judge(forged)
    assert (first.reason, first.new) == (NO_SEAL, True)
    assert (again.reason, again.new) == (NO_SEAL, False)
    assert check.admits(sealed(record(address="10.0.0.6:1")))
    assert check.judge(record(machine="m3")).new  # the cache was full: it starts over
    assert RecordCheck(None).admits(forged)
    assert RecordCheck(None).ticket(UID, "m1", "w1") == ""


def test_placement_reseals_a_record_it_rewrites() -> None:
    check = RecordCheck(KEYS)
    lost = msgspec.structs.replace(sealed(record()), state="lost", address="", updated_at=9e9)
    assert not check.admits(lost)
    assert check.admits(msgspec.structs.replace(lost, seal=check.resealed(lost)))


def test_the_view_ignores_a_refused_record_and_keeps_what_it_knew(
        caplog: pytest.LogCaptureFixture) -> None:
    guard = RouteGuard(KEYS)
    view = View("localhost", clock=lambda: 100.0, wall=lambda: 100.0)
    view.admit = guard
    view.set_app("hello", msgspec.structs.replace(parse({"name": "hello", "image": "img"}),
                                                  uid=UID))
    genuine = sealed(record())
    view.apply_record("hello", "m1", genuine)
    assert [s.address for s in view.apps["hello"].routable] == ["10.0.0.5:8080"]
    rerouted = msgspec.structs.replace(genuine, address="127.0.0.1:6666", updated_at=60.0)
    invented = sealed(record(machine="m2", worker="w2", address="127.0.0.1:6666"),
                      worker="w9")
    stopped = msgspec.structs.replace(genuine, state="stopped", address="", updated_at=61.0)
    with caplog.at_level(logging.WARNING, "thaw.edge.view"):
        for _ in range(3):  # a resync reads them again: judged, logged and counted once
            view.apply_record("hello", "m1", rerouted)
            view.apply_record("hello", "m2", invented)
            view.apply_record("hello", "m1", stopped)
    assert [s.address for s in view.apps["hello"].routable] == ["10.0.0.5:8080"]
    assert guard.refused == {BAD_SEAL: 3}
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 3 and "app hello on worker w2" in refusals[1]


def test_an_edge_without_route_keys_routes_by_every_record() -> None:
    guard = RouteGuard(None)
    assert not guard.verifies and guard("hello", record()) and guard.refused == {}
