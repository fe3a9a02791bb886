"""The edge's view: what it learnt itself wins over older registry records."""

from __future__ import annotations

from edge.view import View
from thaw.appconfig import parse
from thaw.registry.types import MachineRecord


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(updated_at: float, state: str = "started") -> MachineRecord:
    return MachineRecord(id="m1", app="hello", worker="w1", region="local", state=state,
                         image_digest="", created_at=0.0, updated_at=updated_at,
                         address="127.0.0.1:9000")


def view_with_machine(wall: Clock) -> View:
    view = View("localhost", clock=Clock(), wall=wall)
    view.set_app("hello", parse({"name": "hello", "image": "img"}))
    view.apply_record("hello", "m1", record(updated_at=50.0))
    return view


def test_a_machine_seen_dead_is_not_revived_by_an_older_registry_record() -> None:
    wall = Clock()
    view = view_with_machine(wall)
    [slot] = view.apps["hello"].routable
    view.mark(slot, "gone")  # connects refused
    view.apply_record("hello", "m1", record(updated_at=60.0))  # the dead host's last word
    assert view.apps["hello"].routable == []


def test_a_newer_record_from_its_worker_brings_the_machine_back() -> None:
    wall = Clock()
    view = view_with_machine(wall)
    [slot] = view.apps["hello"].routable
    view.mark(slot, "gone")
    view.apply_record("hello", "m1", record(updated_at=wall.now + 1))
    assert [s.id for s in view.apps["hello"].routable] == ["m1"]
    assert view.tombstones == {}


def test_routes_follow_app_changes_after_being_looked_up() -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("hello", parse({"name": "hello", "image": "img", "hosts": ["www.example.com"]}))
    hello = view.apps["hello"]
    assert view.route("hello.localhost") is hello
    assert view.route("www.example.com") is hello
    view.set_app("other", parse({"name": "other", "image": "img",
                                 "hosts": ["www.example.com"]}))
    view.set_app("hello", parse({"name": "hello", "image": "img"}))
    assert view.route("www.example.com") is view.apps["other"]
    view.set_app("hello", None)
    assert view.route("hello.localhost") is None
    assert view.route("nobody.localhost") is None
