"""The edge's view: what it learnt itself wins over older registry records."""

from __future__ import annotations

import logging
import random

import msgspec
import pytest

from edge.view import View
from ground.appconfig import AppConfig, parse
from ground.registry.types import MachineEvent, MachineRecord


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


def test_a_machine_of_another_incarnation_of_the_name_is_never_routed() -> None:
    """An earlier app of this name left a started machine: the new app is not it."""
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("hello", msgspec.structs.replace(parse({"name": "hello", "image": "img"}),
                                                  uid="0123456789abcdef"))
    left = msgspec.structs.replace(record(updated_at=50.0), app_uid="fedcba9876543210")
    view.apply_record("hello", "m1", left)
    assert view.apps["hello"].routable == []
    own = msgspec.structs.replace(left, id="m2", app_uid="0123456789abcdef")
    view.apply_record("hello", "m2", own)
    assert [s.id for s in view.apps["hello"].routable] == ["m2"]


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


def app_config(name: str, hosts: list[str] | None = None) -> AppConfig:
    """A config as the registry may hold it: `hosts` as given, not normalised by parse."""
    return msgspec.structs.replace(parse({"name": name, "image": "img"}), hosts=hosts or [])


def test_an_apps_own_name_under_the_domain_wins_over_another_apps_host() -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("hello", app_config("hello"))
    view.set_app("squat", app_config("squat", ["hello.localhost", "ghost.localhost"]))
    assert view.route("hello.localhost") is view.apps["hello"]
    assert view.route("ghost.localhost") is None  # no app "ghost": a claim under the domain
    assert view.route("squat.localhost") is view.apps["squat"]


def test_a_host_that_is_the_edges_domain_or_under_it_is_ignored() -> None:
    view = View("Apps.Example.", clock=Clock(), wall=Clock())
    view.set_app("web", app_config("web", ["apps.example", "x.APPS.example.", "www.web.test"]))
    assert view.hosts == {"www.web.test": "web"}
    assert view.route("apps.example") is None and view.route("x.apps.example") is None
    assert view.route("web.apps.example") is view.apps["web"]


def test_a_host_claimed_by_two_apps_routes_to_neither_and_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("a", app_config("a", ["shared.test", "a.test"]))
    assert view.route("shared.test") is view.apps["a"]  # remembered, and then forgotten
    with caplog.at_level(logging.WARNING, logger="thaw.edge.view"):
        view.set_apps([app_config("a", ["shared.test", "a.test"]),
                       app_config("b", ["SHARED.test.", "b.test"])])
    assert view.route("shared.test") is None
    assert view.route("a.test") is view.apps["a"] and view.route("b.test") is view.apps["b"]
    conflicts = [r for r in caplog.records if "shared.test" in r.getMessage()]
    assert len(conflicts) == 1 and "'a'" in conflicts[0].getMessage()
    view.set_app("b", None)
    assert view.route("shared.test") is view.apps["a"]


def test_host_names_are_compared_lower_case_without_a_trailing_dot() -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("web", app_config("web", ["WWW.Example.COM."]))
    assert view.route("www.example.com") is view.apps["web"]


def test_a_full_load_replaces_the_apps_and_drops_the_missing_ones() -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_apps([app_config("a", ["a.test"]), app_config("b")])
    view.set_apps([app_config("b", ["a.test"])])
    assert sorted(view.apps) == ["b"] and view.route("a.test") is view.apps["b"]


def hosts_from_scratch(view: View) -> dict[str, str]:
    """What the host map must be: every app's hosts claimed afresh (the rule, not the
    incremental bookkeeping)."""
    claims: dict[str, set[str]] = {}
    for entry in view.apps.values():
        for raw in entry.config.hosts:
            host = raw.lower().rstrip(".")
            if host and host != view.domain and not host.endswith(view.domain_suffix):
                claims.setdefault(host, set()).add(entry.name)
    return {host: apps.pop() for host, apps in claims.items() if len(apps) == 1}


def test_host_claims_kept_app_by_app_always_equal_claims_made_from_scratch() -> None:
    rng = random.Random(12)
    pool = ["a.test", "B.test.", "b.test", "c.test", "x.localhost", "localhost", "d.test"]
    view = View("localhost", clock=Clock(), wall=Clock())
    for _ in range(2000):
        name = rng.choice(["p", "q", "r", "s"])
        if rng.random() < 0.2:
            view.set_app(name, None)
        elif rng.random() < 0.1:
            view.set_apps([app_config(n, rng.sample(pool, rng.randint(0, 3))) for n in "pqs"],
                          prune=rng.random() < 0.5)
        else:
            view.set_app(name, app_config(name, rng.sample(pool, rng.randint(0, 3))))
        assert view.hosts == hosts_from_scratch(view)
        for host in ["a.test", "b.test", "c.test", "d.test"]:
            entry = view.route(host)
            assert (entry.name if entry else None) == view.hosts.get(host)


def test_a_contested_host_is_reported_when_it_becomes_so_not_on_every_full_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    configs = [app_config("a", ["shared.test", "a.localhost"]), app_config("b", ["shared.test"])]
    with caplog.at_level(logging.WARNING, logger="thaw.edge.view"):
        for _ in range(3):
            view.set_apps(configs)
    assert len([r for r in caplog.records if "shared.test" in r.getMessage()]) == 1
    assert len([r for r in caplog.records if "a.localhost" in r.getMessage()]) == 1


def test_a_config_change_that_keeps_the_hosts_keeps_the_remembered_routes() -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("web", app_config("web", ["www.web.test"]))
    entry = view.route("www.web.test")
    view.set_app("web", msgspec.structs.replace(app_config("web", ["www.web.test"]), version=2))
    assert view.route("www.web.test") is entry and entry.config.version == 2


def test_two_records_naming_one_address_never_share_or_cut_each_others_connections() -> None:
    """A worker may route its own machine to any address, even another machine's: its
    connections (pooled, or cut when it is lost) are that machine's own, keyed by it."""
    from edge.view import MachineSlot

    victim = MachineSlot("victim", "vvvv", "10.9.0.5:8080", "started", 0.0, worker="X")
    evil = MachineSlot("evil", "mmmm", "10.9.0.5:8080", "started", 0.0, worker="W")
    assert victim.pool_key != evil.pool_key
    assert victim.pool_key.endswith("10.9.0.5:8080") and evil.pool_key.startswith("mmmm")


def resting(mid: str, state: str = "suspended", **fields: object) -> MachineRecord:
    return msgspec.structs.replace(record(updated_at=50.0, state=state), id=mid, address="",
                                   events=[MachineEvent(state, 50.0, "")], **fields)


def test_the_machine_to_thaw_is_the_one_a_wake_would_resume() -> None:
    """Placement's choice (placement/core/wake.py): the lowest id of the app's suspended
    machines of its release, in the region woken ("": the app's primary)."""
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("hello", parse({"name": "hello", "image": "img", "regions": ["fra", "ams"]}))
    entry = view.apps["hello"]
    assert entry.to_thaw("") is None  # none suspended
    for mid, fields in (("m5", {"region": "fra"}), ("m3", {"region": "fra"}),
                        ("m1", {"region": "ams"}), ("m2", {"region": "fra", "release": 7})):
        view.apply_record("hello", mid, resting(mid, **fields))
    assert set(entry.resting) == {"m5", "m3", "m1", "m2"}
    assert all(r.events == [] for r in entry.resting.values())  # kept without their history
    thaw = entry.to_thaw("")
    assert thaw is not None and thaw.id == "m3"  # primary fra; m2 is another release
    thaw = entry.to_thaw("ams")
    assert thaw is not None and thaw.id == "m1"
    assert entry.to_thaw("lhr") is None


def test_no_machine_to_thaw_while_one_is_up_or_starting_and_records_leave_as_they_change(
) -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("hello", parse({"name": "hello", "image": "img"}))
    entry = view.apps["hello"]
    view.apply_record("hello", "m1", resting("m1"))
    view.apply_record("hello", "m2", resting("m2", state="starting"))
    assert entry.to_thaw("") is None  # a wake would wait for the starting one
    view.apply_record("hello", "m2", None)  # deleted
    assert set(entry.resting) == {"m1"}
    thaw = entry.to_thaw("")
    assert thaw is not None and thaw.id == "m1"
    view.add_started("hello", "m1", "127.0.0.1:9000", "w1")  # thawed: up, not resting
    assert entry.resting == {} and entry.to_thaw("") is None
    view.apply_record("hello", "m1", resting("m1", updated_at=200.0))  # suspended again
    assert set(entry.resting) == {"m1"} and entry.machines == {}
    view.apply_record("hello", "m1", resting("m1", state="stopped", updated_at=300.0))
    assert entry.resting == {}  # a stopped machine is placement's to start (a boot)


def test_a_resting_machine_of_another_incarnation_is_never_thawed() -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    first = msgspec.structs.replace(parse({"name": "hello", "image": "img"}),
                                    uid="0123456789abcdef")
    view.set_app("hello", first)
    view.apply_record("hello", "m1", resting("m1", app_uid="fedcba9876543210"))
    assert view.apps["hello"].resting == {} and view.apps["hello"].to_thaw("") is None
    view.apply_record("hello", "m2", resting("m2", app_uid=first.uid))
    assert set(view.apps["hello"].resting) == {"m2"}
    view.set_app("hello", msgspec.structs.replace(first, uid="fedcba9876543210"))  # made anew
    assert view.apps["hello"].resting == {} and view.apps["hello"].to_thaw("") is None


def test_a_failed_workers_resting_machines_are_not_thawed() -> None:
    view = View("localhost", clock=Clock(), wall=Clock())
    view.set_app("hello", parse({"name": "hello", "image": "img"}))
    view.apply_record("hello", "m1", resting("m1", worker="w1"))
    view.apply_record("hello", "m2", resting("m2", worker="w2"))
    view.worker_failed("w1")
    assert set(view.apps["hello"].resting) == {"m2"}


def test_a_machine_this_edge_auto_stopped_is_still_thawed_by_it() -> None:
    """Placement answers an auto-stop after the agent wrote `suspended`; the edge then
    marks the machine (a tombstone newer than that record): the record is still kept as
    the machine to thaw, though never routed by."""
    wall = Clock()
    view = view_with_machine(wall)
    [slot] = view.apps["hello"].routable
    wall.now = 200.0
    view.mark(slot, "stopped")  # the auto-stop's answer
    view.apply_record("hello", "m1", resting("m1", updated_at=150.0))  # written before it
    thaw = view.apps["hello"].to_thaw("")
    assert thaw is not None and thaw.id == "m1" and view.apps["hello"].routable == []
