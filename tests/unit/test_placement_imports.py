"""What placement may import of the agent: its wire types (agent/api.py) and nothing else —
the agent's core (machine states, records) is the agent's own, and a worker of another
kind is spoken to through the same `Workers` port (placement/ports/workers.py). Only the port's
adapter speaks HTTP to agents (their paths appear nowhere else in placement)."""

from __future__ import annotations

import re

from tests.support.imports import ROOT, imported_modules, module_name

PLACEMENT = ROOT / "placement"
ADAPTER = PLACEMENT / "adapters" / "agents.py"
# the agent API's paths (agent/adapters/http.py), as placement would write them
AGENT_PATH = re.compile(r"""["']/(v1/offers|v1/machines|v1/images/pull|healthz)""")


def test_placement_imports_of_the_agent_only_its_wire_types() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(name for name in imported_modules(path)
                                            if name.split(".")[0] == "agent"
                                            and name != "agent.api")
        for path in PLACEMENT.rglob("*.py")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_the_workers_adapter_imports_the_port_and_the_port_no_adapter() -> None:
    assert "placement.ports.workers" in imported_modules(ADAPTER)
    assert not {name for name in imported_modules(PLACEMENT / "ports" / "workers.py")
                if name.startswith("placement.")}


def test_only_the_adapter_knows_the_agents_paths_and_only_it_and_the_runner_import_it(
) -> None:
    """(placement's own /healthz routes, served by its adapters, are not the agents')"""
    served = {PLACEMENT / "adapters" / "routes.py", PLACEMENT / "adapters" / "admin.py"}
    for path in PLACEMENT.rglob("*.py"):
        if path == ADAPTER:
            continue
        name = str(path.relative_to(ROOT))
        if path not in served:
            assert not AGENT_PATH.search(path.read_text()), name
        if path != PLACEMENT / "runner.py":
            # fenced_by (the reconciler's fencing context) is the one other name it gives
            assert "placement.adapters.agents" not in imported_modules(path) or \
                "AgentClient" not in path.read_text(), name


# -- placement's floors: every arrow points down -----------------------------------------

# Placement's modules by floor, bottom up. A module may import its own floor and those
# below it, never one above: the core knows nothing of placement's shell; the ports
# (what placement needs of the world, and its wire types and errors) know only the core;
# the adapters that carry the ports out (to agents, Redis, memory, SQL) know the ports;
# the shell (wakes, the reconciler, apps) uses ports and adapters; the API adapters
# that drive the shell sit above it; the runner puts everything together.
FLOORS: list[tuple[str, list[str]]] = [
    ("core", ["placement", "placement.core", "placement.core.*"]),  # (inits import nothing)
    ("ports", ["placement.ports", "placement.ports.*", "placement.api", "placement.errors"]),
    ("driven adapters", ["placement.adapters.agents", "placement.adapters.coordination",
                         "placement.adapters.memory", "placement.store", "placement.store.*"]),
    ("shell", ["placement.*"]),
    ("API adapters", ["placement.adapters", "placement.adapters.*", "placement.openapi"]),
    ("composition root", ["placement.runner", "placement.config"]),
]


def floor_of(name: str) -> int:
    """The floor a module is on: the most specific pattern that names it (an exact name
    before a wildcard, the longer wildcard before the shorter)."""
    best: tuple[int, int, int] | None = None  # (exact, prefix length, floor)
    for floor, (_, patterns) in enumerate(FLOORS):
        for pattern in patterns:
            if pattern == name:
                key = (1, len(pattern), floor)
            elif pattern.endswith(".*") and name.startswith(pattern[:-1]):
                key = (0, len(pattern), floor)
            else:
                continue
            if best is None or key[:2] > best[:2]:
                best = key
    assert best is not None, f"{name} is on no floor"
    return best[2]


def test_every_placement_import_points_down_or_across_never_up() -> None:
    upward = []
    for path in sorted(PLACEMENT.rglob("*.py")):
        name = module_name(path)
        mine = floor_of(name)
        for target in sorted(imported_modules(path)):
            if target.split(".")[0] != "placement" or target == "placement":
                continue
            theirs = floor_of(target)
            if theirs > mine:
                upward.append(f"{name} ({FLOORS[mine][0]}) -> {target} ({FLOORS[theirs][0]})")
    assert upward == []


def test_the_floors_are_what_they_say() -> None:
    """The rule itself: a few modules where they belong (a typo in FLOORS fails here)."""
    assert [FLOORS[floor_of(name)][0] for name in (
        "placement.core.market", "placement.ports.workers", "placement.errors",
        "placement.adapters.coordination", "placement.store.sqlite", "placement.wakes.waker",
        "placement.adapters.http", "placement.runner",
    )] == ["core", "ports", "ports", "driven adapters", "driven adapters", "shell",
           "API adapters", "composition root"]


def test_placement_speaks_in_types_not_untyped_dicts() -> None:
    """No `dict[str, Any]` in placement: what comes from workers is `agent/api.py`'s
    types, what the API takes and answers `placement/api.py`'s, and a JSON object whose
    fields are checked where read (a merge patch, an OpenAPI document) `JsonObject`,
    `dict[str, object]` — its values unusable unchecked."""
    untyped = re.compile(r"dict\[str,\s*(typing\.)?Any\]")
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in PLACEMENT.rglob("*.py")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if untyped.search(line)]
    assert found == []


# The shell's rooms, each importing only those before it: the fleet (what workers and
# machines there are), the wakes (which start machines on it), the reconciling (which
# wakes and places to keep each app's shape).
ROOMS = ("fleet", "wakes", "reconciling")


def test_the_shells_rooms_import_one_way_fleet_then_wakes_then_reconciling() -> None:
    backward = []
    for rank, room in enumerate(ROOMS):
        for path in sorted((PLACEMENT / room).rglob("*.py")):
            for target in sorted(imported_modules(path)):
                parts = target.split(".")
                if len(parts) > 1 and parts[0] == "placement" and parts[1] in ROOMS \
                        and ROOMS.index(parts[1]) > rank:
                    backward.append(f"{module_name(path)} -> {target}")
    assert backward == []
