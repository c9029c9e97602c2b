"""Imports only point down (docs/architecture.md, "Layers"), checked over the source with ``ast``.

Every ``import`` of a lockgate module counts, wherever it is written: at module level,
inside a function, or under ``if TYPE_CHECKING:``. The rules:

* ``plan/`` never imports ``api/``, ``execution/`` or ``testing/``;
* ``state/``, ``checkpoint/``, ``sources/`` and ``sinks/`` import nothing above them
  (``plan/``, ``execution/``, ``api/``, ``testing/``);
* ``execution/`` never imports ``api/`` or ``testing/``;
* the modules below every package (``errors``, ``options``, ``clock``, ``jvm``,
  ``row_codec``, ``compat``) import no package of lockgate;
* importing ``lockgate`` itself (whose ``__init__`` imports the API) counts as importing
  ``api/``;
* no module imports another module's ``_private`` name.

``api/`` is a thin PySpark-shaped facade: it never reaches into Spark's JVM side (a
DataFrame's ``_jdf``, a Column's ``_jc``, the session's ``_jvm``/``_jsparkSession``, a
query execution and its plans) nor imports ``py4j``; what Spark's plans say is read in
``plan/`` (``aggregate_plan.py``, ``event_time.py``, ``explain.py``, ``sql_plan.py``,
``catalog.py``), which the API calls with plan values.

And the only import cycle is the API's own (``lockgate``, ``api/`` and ``testing/``,
whose ``MemoryStream`` builds streaming DataFrames the API re-exports), as PySpark's
DataFrame and writer import each other: every other package's modules form a DAG.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
BASE = ("errors", "options", "clock", "jvm", "row_codec", "compat")
"""``lockgate/*.py`` below every package: they import only each other."""
FORBIDDEN.update(
    {
        base: ("api", "execution", "plan", "state", "checkpoint", "sources", "sinks", "testing", "cli", "demo")
        for base in BASE
    }
)

JVM_ATTRIBUTES = frozenset(
    {
        "_jdf", "_jc", "_jvm", "_jsc", "_jsparkSession", "_gateway", "_jconf",
        "queryExecution", "analyzed", "logicalPlan", "optimizedPlan", "executedPlan", "sparkPlan",
        "getClass",
    }
)
"""Attributes through which a module reads Spark's JVM side: the py4j handles of a
DataFrame, Column, session or context, and Catalyst's query execution and plans."""

JVM_READS_ALLOWED: dict[str, frozenset[str]] = {}
"""API modules that may read some of those attributes, and which (none do: each read
of theirs has a function in ``plan/``)."""

CYCLE_ALLOWED = ("api", "testing")
"""Layers whose modules may import each other in a cycle (``lockgate`` itself is ``api``)."""


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
    found = sorted(violations())
    assert not found, "imports that break the layer rules (docs/architecture.md):\n" + "\n".join(map(str, found))


def test_the_layer_check_finds_an_import_from_below_every_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lockgate/jvm.py`` importing a plan module would break the rule for ``lockgate/*.py``."""
    real = _imports

    def with_edge(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str | None]]:
        return real(module, path, modules) + ([("lockgate.plan.nodes", None)] if module == "lockgate.jvm" else [])

    monkeypatch.setitem(globals(), "_imports", with_edge)
    assert ("lockgate.jvm", "lockgate.plan.nodes") in violations()


def jvm_reads(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every read of ``JVM_ATTRIBUTES`` and every ``py4j`` import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in JVM_ATTRIBUTES:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "py4j"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "py4j":
            found.append((node.lineno, node.module or ""))
    return sorted(found)


def api_jvm_reads() -> list[str]:
    out = []
    for module, path in sorted(_modules().items()):
        if _layer(module) != "api":
            continue
        allowed = JVM_READS_ALLOWED.get(module, frozenset())
        out += [f"{module}:{line}: {what}" for line, what in jvm_reads(path) if what not in allowed]
    return out


def test_the_api_reads_no_catalyst_plan() -> None:
    found = api_jvm_reads()
    assert not found, "api/ reads Spark's JVM side; read it in plan/ (docs/architecture.md):\n" + "\n".join(found)


def test_the_jvm_read_check_sees_each_kind_of_read(tmp_path: Path) -> None:
    """What api/grouped.py, api/dataframe.py and api/sql.py read before their reads moved to plan/."""
    source = (
        "from py4j.protocol import Py4JJavaError\n"
        "def agg(df, spark, name):\n"
        "    plan = df._template._jdf.queryExecution().analyzed()\n"
        "    text = df._template._jdf.queryExecution().executedPlan().toString()\n"
        "    node = spark._jvm.org.apache.spark.sql.classic.ExpressionColumnNode.apply(plan)\n"
        "    return spark._jsparkSession.sessionState(), plan.getClass().getSimpleName()\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = {what for _, what in jvm_reads(path)}
    assert found == {
        "py4j.protocol", "_jdf", "queryExecution", "analyzed", "executedPlan", "_jvm", "_jsparkSession", "getClass"
    }


def import_cycles(added: tuple[tuple[str, str], ...] = ()) -> list[list[str]]:
    """The strongly connected components (more than one module) of the import graph, with
    the ``added`` (importer, imported) edges."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, target in added:
        edges[module].add(target)
    for module, path in modules.items():
        for target, _ in _imports(module, path, modules):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != module:
                edges[module].add(target)
    # Tarjan's algorithm, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycle_outside_the_api() -> None:
    outside = [c for c in import_cycles() if any(_layer(m) not in CYCLE_ALLOWED for m in c)]
    assert not outside, "import cycles (docs/architecture.md):\n" + "\n".join(map(str, outside))


def test_the_cycle_check_finds_a_cycle() -> None:
    """An import of the aggregation from the pushdown module would close a cycle."""
    cycles = import_cycles(added=(("lockgate.plan.pushdown", "lockgate.plan.aggregate"),))
    assert any({"lockgate.plan.aggregate", "lockgate.plan.pushdown"} <= set(c) for c in cycles)


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


def test_no_test_module_imports_another() -> None:
    """Shared test helpers live in helper modules (``differential.py``, ``redis_testing.py``,
    ``expression_cases.py`` ...), never in a ``test_*`` module another one imports."""
    tests = Path(__file__).parent
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(tests)}: {n}" for n in names if n.split(".")[-1].startswith("test_")]
    assert not found, "test modules importing test modules:\n" + "\n".join(found)
