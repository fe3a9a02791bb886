"""What a module imports, read from its source: the house's import tests
(tests/unit/test_*_imports.py) check their rules on it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    """The dotted name of the module at `path` (a package's `__init__` is the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module name `path` imports, wherever the statement is (in a function, under
    TYPE_CHECKING): `import a.b` gives a.b; `from a import b` gives a and a.b (b may be a
    module); relative imports are not counted (the project uses none)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


PACKAGES = ("agent", "edge", "ground", "imagecache", "placement", "thaw")
# every module of the project's packages, by dotted name
MODULES = {module_name(path): path for package in PACKAGES
           for path in (ROOT / package).rglob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """The project's modules `path` imports (names imported from a module that are not
    modules themselves left out)."""
    return {name for name in imported(path) if name in MODULES}
