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
``catalog.py``), which the API calls with plan values. The names checked include the
Scala and Catalyst accessors a reader of Spark's parsed plan calls, none of which PySpark's
API has (``test_the_jvm_names_are_not_pyspark_names``); and ``ls.sql`` runs with a
profiler that fails on any call from ``api/`` into py4j (``api/sql.py`` walks the Python
tree of ``plan/sql_plan.py``).

And the only import cycle is the API's own (``lockgate``, ``api/`` and ``testing/``,
whose ``MemoryStream`` builds streaming DataFrames the API re-exports), as PySpark's
DataFrame and writer import each other: every other package's modules form a DAG.
"""

from __future__ import annotations

import ast
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import py4j
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, GroupedData, Row, SparkSession
from pyspark.sql.streaming import (
    DataStreamReader,
    DataStreamWriter,
    StreamingQuery,
    StreamingQueryManager,
)
from pyspark.sql.types import DataType, StructField, StructType

import lockgate
from lockgate.api.dataframe import StreamingDataFrame
from lockgate.api.grouped import StreamingGroupedData
from lockgate.errors import LockgateError
from lockgate.plan import sql_plan

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
BASE = ("errors", "options", "clock", "jvm", "row_codec", "compat", "hosts")
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
        "getClass", "getSimpleName",
        # Scala and Catalyst accessors of a parsed plan, as api/sql.py once called them
        "sqlParser", "parsePlan", "ofRows", "projectList", "aggregateExpressions",
        "groupingExpressions", "havingCondition", "limitExpr", "joinType", "usingColumns",
        "cteRelations", "nameParts", "multipartIdentifier", "allowMissingCol", "isDefined",
        "_1", "_2",
    }
)
"""Attributes through which a module reads Spark's JVM side: the py4j handles of a
DataFrame, Column, session or context, Catalyst's query execution and plans, and the
accessors of Spark's parsed plans and Scala values (none of them a PySpark name:
``test_the_jvm_names_are_not_pyspark_names``)."""

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
        "def translate(node):\n"
        "    items = node.projectList()\n"
        "    ctes = [pair._2() for pair in node.cteRelations()]\n"
        "    return items, ctes, node.condition().isDefined()\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = {what for _, what in jvm_reads(path)}
    assert found == {
        "py4j.protocol", "_jdf", "queryExecution", "analyzed", "executedPlan", "_jvm", "_jsparkSession", "getClass",
        "getSimpleName", "projectList", "_2", "cteRelations", "isDefined",
    }


def test_the_jvm_names_are_not_pyspark_names() -> None:
    """No name the check refuses is an attribute of the PySpark classes the API wraps
    and hands out, nor of lockgate's own API classes, so PySpark-shaped code never trips it."""
    classes = (
        Column, DataFrame, GroupedData, Row, SparkSession, DataStreamReader, DataStreamWriter, StreamingQuery,
        StreamingQueryManager, DataType, StructField, StructType, StreamingDataFrame, StreamingGroupedData,
    )
    public = {name for cls in classes for name in dir(cls) if not name.startswith("_")}
    assert not (JVM_ATTRIBUTES & public)


def py4j_calls_from(directory: Path, run: Callable[[], object]) -> list[str]:
    """``run()`` under a profiler: every call into py4j's Python code (a py4j object's
    method, attribute or conversion) made directly by code under ``directory``. Calls
    PySpark makes for the code (``df.select(...)``) are PySpark's, not counted, nor py4j's
    weakref callbacks that release JVM objects as Python collects them."""
    py4j_dir = str(Path(py4j.__file__).parent)
    under = str(directory)
    found: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(py4j_dir):
            return
        code = frame.f_code
        if code.co_argcount and isinstance(frame.f_locals.get(code.co_varnames[0]), weakref.ref):
            return  # py4j releasing a garbage-collected JVM object, wherever collection happens
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename.startswith(under):
            found.append(f"{caller.f_code.co_filename}:{caller.f_lineno}: {frame.f_code.co_name}")

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return found


SQL_QUERIES = (
    # every node of plan/sql_plan.py, applied over a streaming view, a static table and a CTE
    "SELECT id, upper(name) AS n FROM {ev} e WHERE e.id % 2 = 0",
    "SELECT id FROM {ev} WHERE id < 3 UNION ALL SELECT id FROM {ev} WHERE id > 6",
    "WITH a AS (SELECT * FROM {ev}), s AS (SELECT * FROM {dim}) SELECT a.id, s.label FROM a JOIN s ON a.name = s.name",
    "SELECT name AS nm, count(*) AS c FROM {ev} GROUP BY nm HAVING c > 2",
    "SELECT name, count(*) FROM {ev} GROUP BY 1 HAVING count(*) > 2",
    "SELECT name, max(id) FROM {ev} GROUP BY name HAVING name <> 'n1'",
    "SELECT DISTINCT name FROM {ev}",
    "SELECT name, count(*) AS c FROM {ev} GROUP BY name ORDER BY c DESC",
    "SELECT * FROM {ev} LIMIT 3",
    "SELECT * FROM {ev} JOIN {dim} USING (name)",
    "SELECT * FROM {ev} e JOIN (SELECT name, row_number() OVER (ORDER BY name) AS r FROM {dim}) x ON e.name = x.name",
    "SELECT name FROM {ev} EXCEPT SELECT name FROM {ev} WHERE id > 3",
    "SELECT id FROM {ev} INTERSECT SELECT id FROM {ev}",
    "SELECT * FROM {ev} NATURAL JOIN {dim}",
    "SELECT * FROM {ev} WHERE id IN (SELECT id FROM {ev})",
    "SELECT * FROM {ev} LATERAL VIEW explode(array(1, 2)) t AS x",
)


def test_the_sql_path_touches_no_py4j_object(ls, tmp_path: Path) -> None:
    """``ls.sql`` over every node kind of the parsed-plan tree (those refused too): no
    code of ``api/`` calls into py4j; Spark's parsed plan is read in ``plan/sql_plan.py``."""
    suffix = tmp_path.name[-12:].replace("-", "_")
    names = {"ev": f"ev_{suffix}", "dim": f"dim_{suffix}"}
    ls.readStream.schema("id LONG, name STRING, ts TIMESTAMP").json(str(tmp_path)).createOrReplaceTempView(names["ev"])
    ls.spark.createDataFrame([("n0", "zero")], "name STRING, label STRING").createOrReplaceTempView(names["dim"])
    kinds: set[type] = set()
    results = []

    def run() -> None:
        for query in SQL_QUERIES:
            text = query.format(**names)
            tree = sql_plan.parse(ls.spark, text)
            assert tree is not None, text
            stack = [tree]
            while stack:
                node = stack.pop()
                kinds.add(type(node))
                stack.extend(node.nested)
            try:
                results.append(type(ls.sql(text)).__name__)
            except (LockgateError, AnalysisException) as exc:
                results.append(type(exc).__name__)
        with pytest.raises(LockgateError):
            ls.sql(f"SELECT * FROM {names['ev']} WHERE id > :x", {"x": 1})

    found = py4j_calls_from(PACKAGE / "api", run)
    assert not found, "api/ calls into py4j on the SQL path; read Spark's plan in plan/:\n" + "\n".join(found)
    nodes = {
        cls for cls in vars(sql_plan).values()
        if isinstance(cls, type) and issubclass(cls, sql_plan.Node) and not cls.__name__.startswith("_")
    }
    # Spark's parser makes no Deduplicate (SELECT DISTINCT is a Distinct); ls.sql applies one as distinct()
    assert nodes - kinds == {sql_plan.Node, sql_plan.Deduplicate}
    assert results.count("StreamingDataFrame") == 11


def test_the_py4j_call_check_sees_a_call_and_not_pyspark_s(spark, tmp_path: Path) -> None:
    """A probe module that reads a parsed plan through py4j is caught; one that calls
    PySpark (which calls py4j itself) is not."""
    (tmp_path / "probe_jvm.py").write_text(
        "def run(spark):\n"
        "    plan = spark._jsparkSession.sessionState().sqlParser().parsePlan('SELECT 1')\n"
        "    return plan.getClass().getSimpleName()\n"
    )
    (tmp_path / "probe_pyspark.py").write_text("def run(spark):\n    return spark.range(2).selectExpr('id + 1').columns\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import probe_jvm
        import probe_pyspark
    finally:
        sys.path.remove(str(tmp_path))
    assert len(py4j_calls_from(tmp_path, lambda: probe_jvm.run(spark))) >= 4
    assert py4j_calls_from(tmp_path, lambda: probe_pyspark.run(spark)) == []


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
