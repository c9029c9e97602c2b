"""Imports only point down (docs/architecture.md, "Layers"), checked over the source with ``ast``.

Every ``import`` of a lockgate module counts, wherever it is written: at module level,
inside a function, or under ``if TYPE_CHECKING:``. The rules:

* ``plan/`` never imports ``api/``, ``execution/`` or ``testing/``;
* ``state/``, ``checkpoint/``, ``sources/`` and ``sinks/`` import nothing above them
  (``plan/``, ``execution/``, ``api/``, ``testing/``);
* ``execution/`` never imports ``api/`` or ``testing/``;
* importing ``lockgate`` itself (whose ``__init__`` imports the API) counts as importing
  ``api/``;
* no module imports another module's ``_private`` name.

Violations that exist today and go with the second half of the restructuring (issue 20:
the stateful-operator contract, one owner for event-time lineage, query assembly in
``execution/``) are listed in ``KNOWN``. The test fails on a violation not listed and on
a listed one that no longer exists, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lockgate

PACKAGE = Path(lockgate.__file__).parent

# Layers above each checked layer: what it must not import.
FORBIDDEN = {
    "plan": ("api", "execution", "testing"),
    "state": ("plan", "execution", "api", "testing"),
    "checkpoint": ("plan", "execution", "api", "testing"),
    "sources": ("plan", "execution", "api", "testing"),
    "sinks": ("plan", "execution", "api", "testing"),
    "execution": ("api", "testing"),
}

# (importing module, imported module) for layer rules; (importing module, imported
# module, name) for private names. Each entry is removed by the change that removes it.
KNOWN: set[tuple[str, ...]] = {
    # The state reader (ls.read.state) reads each operator's state layout from the
    # operators' modules: it moves with the stateful-operator contract.
    ("lockgate.state.reader", "lockgate.plan.join.planner"),
    ("lockgate.state.reader", "lockgate.plan.session_window"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("lockgate", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str | None]]:
    """(imported lockgate module, imported name or None) for every import in ``path``."""
    is_package = path.name == "__init__.py"
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, None) if sub in modules else (target, alias.name))
    return [(t, n) for t, n in out if t == "lockgate" or t.startswith("lockgate.")]


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"  # lockgate/__init__.py re-exports the API
    return parts[1]


def violations() -> set[tuple[str, ...]]:
    modules = _modules()
    found: set[tuple[str, ...]] = set()
    for module, path in modules.items():
        forbidden = FORBIDDEN.get(_layer(module), ()) if module != "lockgate" else ()
        for target, name in _imports(module, path, modules):
            owner = target
            while owner not in modules and "." in owner:
                owner = owner.rsplit(".", 1)[0]
            if _layer(owner) in forbidden:
                found.add((module, owner))
            if name and name.startswith("_") and not name.startswith("__") and owner != module:
                found.add((module, owner, name))
    return found


def test_imports_point_down() -> None:
    found = violations()
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    assert not new, "imports that break the layer rules (docs/architecture.md):\n" + "\n".join(map(str, new))
    assert not gone, "listed in KNOWN but no longer there (remove them from the list):\n" + "\n".join(map(str, gone))


def test_the_check_sees_each_kind_of_import(tmp_path: Path) -> None:
    """The walk finds module-level, function-local, TYPE_CHECKING and relative imports."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from lockgate.api.dataframe import StreamingDataFrame\n"
        "from ..execution import microbatch\n"
        "if TYPE_CHECKING:\n    from lockgate.api import query\n"
        "def f():\n    from lockgate.plan.aggregate import _micros\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    modules = _modules()
    found = _imports("lockgate.plan.probe", path, modules)
    assert ("lockgate.api.dataframe", "StreamingDataFrame") in found
    assert ("lockgate.execution.microbatch", None) in found
    assert ("lockgate.api.query", None) in found
    assert ("lockgate.plan.aggregate", "_micros") in found
