"""What placement may import of the agent: its wire types (agent/api.py) and nothing else —
the agent's core (machine states, records) is the agent's own, and a worker of another
kind is spoken to through the same `Workers` port (placement/workers.py). Only the port's
adapter speaks HTTP to agents (their paths appear nowhere else in placement)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLACEMENT = ROOT / "placement"
ADAPTER = PLACEMENT / "adapters" / "agents.py"
# the agent API's paths (agent/adapters/http.py), as placement would write them
AGENT_PATH = re.compile(r"""["']/(v1/offers|v1/machines|v1/images/pull|healthz)""")


def imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_placement_imports_of_the_agent_only_its_wire_types() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(name for name in imported(path)
                                            if name.split(".")[0] == "agent"
                                            and name != "agent.api")
        for path in PLACEMENT.rglob("*.py")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_the_workers_adapter_imports_the_port_and_the_port_no_adapter() -> None:
    assert "placement.workers" in imported(ADAPTER)
    assert not {name for name in imported(PLACEMENT / "workers.py")
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
            assert "placement.adapters.agents" not in imported(path) or \
                "AgentClient" not in path.read_text(), name
