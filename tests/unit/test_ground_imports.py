"""The shared ground and the roof: the `thaw` package holds both — the ground every
service stands on (app config, registry, auth, host names, image references, periodic
work, state files) and the composition root (`thaw up`, the CLI and its commands,
image builds). The services (edge, placement, agent, imagecache) may import the ground,
never the roof; the ground imports no service and no roof module. The ground is what
the services import, and everything that imports in turn: computed here, so a module
moves between the two by its imports alone, and the test says which arrow broke it."""

from __future__ import annotations

from tests.support.imports import ROOT, imported_modules, module_name

SERVICES = ("edge", "placement", "agent", "imagecache")


THAW = {module_name(path): path for path in (ROOT / "thaw").rglob("*.py")}


def ground() -> set[str]:
    """The thaw modules the services import, and what those import of thaw, to the end."""
    todo = [name for service in SERVICES for path in (ROOT / service).rglob("*.py")
            for name in imported_modules(path) if name in THAW]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [other for other in imported_modules(THAW[name]) if other in THAW]
    return seen


def test_the_ground_imports_no_service() -> None:
    arrows = sorted(f"{name} -> {target}" for name in ground()
                    for target in imported_modules(THAW[name])
                    if target.split(".")[0] in SERVICES)
    assert arrows == []


def test_the_roof_is_what_puts_the_services_together_and_the_ground_is_most_of_thaw() -> None:
    """(The rule itself: the composition root is on the roof, the app config and the
    registry port on the ground.)"""
    shared = ground()
    assert {"thaw.appconfig", "thaw.registry.port", "thaw.auth.signing", "thaw.imageref",
            "thaw.periodic", "thaw.hostnames"} <= shared
    assert not {"thaw.cli", "thaw.up", "thaw.commands", "thaw.imagebuild"} & shared
