"""The shared ground and the roof: `ground/` is what every service stands on (app config,
registry, auth, host names, image references, periodic work, state files); `thaw/` is the
composition root (`thaw up`, the CLI and its commands, image builds), which imports
everything. The arrows: services may import the ground, never the roof; the ground
imports no service and no roof module."""

from __future__ import annotations

from tests.support.imports import ROOT, imported_modules, module_name

SERVICES = ("edge", "placement", "agent", "imagecache")


def modules_of(package: str) -> dict[str, list[str]]:
    return {module_name(path): imported_modules(path) for path in (ROOT / package).rglob("*.py")}


def arrows(package: str, targets: tuple[str, ...]) -> list[str]:
    return sorted(f"{name} -> {target}" for name, imports in modules_of(package).items()
                  for target in imports if target.split(".")[0] in targets)


def test_the_ground_imports_no_service_and_nothing_of_the_roof() -> None:
    assert arrows("ground", (*SERVICES, "thaw")) == []


def test_no_service_imports_the_roof() -> None:
    assert [arrow for service in SERVICES for arrow in arrows(service, ("thaw",))] == []


def test_the_ground_is_what_the_services_share_and_the_roof_what_puts_them_together(
) -> None:
    """(Each service imports the ground; the composition root imports every service.)"""
    for service in SERVICES:
        assert arrows(service, ("ground",)), service
    roof = {target.split(".")[0] for imports in modules_of("thaw").values()
            for target in imports}
    assert set(SERVICES) <= roof
