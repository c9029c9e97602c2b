"""lockgate.api.shipping without a cluster: the zip, the master check, the opt-out.

The cluster tests (test_cluster.py) cover the whole path: executors that cannot import
lockgate run a lockgate query after ``lockgate.session(spark)`` shipped it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from spark_standalone import executor_python

import lockgate
from lockgate import OptionError
from lockgate.api import shipping


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[4, 2]", True),
        ("local-cluster[2,1,1024]", False),
        ("spark://127.0.0.1:7077", False),
        ("yarn", False),
        ("k8s://https://host:443", False),
    ],
)
def test_is_local_master(master: str, local: bool) -> None:
    assert shipping.is_local_master(master) is local


def test_zip_is_built_once_and_named_by_content() -> None:
    path = shipping.package_zip()
    assert shipping.package_zip() == path
    name = Path(path).name
    assert name.startswith("lockgate-") and name.endswith(".zip")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    assert "lockgate/__init__.py" in names
    assert "lockgate/api/shipping.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # Every directory has an entry: zipimport needs them for namespace packages.
    package = Path(lockgate.__file__).parent
    dirs = {
        f"lockgate/{p.relative_to(package).as_posix()}/"
        for p in package.rglob("*")
        if p.is_dir() and p.name != "__pycache__"
    }
    assert dirs <= set(names)


def test_zip_imports_the_whole_package_where_lockgate_is_not_installed(tmp_path: Path) -> None:
    python = executor_python(tmp_path)
    modules = sorted(
        "lockgate." + ".".join(p.relative_to(Path(lockgate.__file__).parent).with_suffix("").parts)
        for p in Path(lockgate.__file__).parent.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    )
    code = (
        "import importlib, importlib.util, sys\n"
        "assert importlib.util.find_spec('lockgate') is None, 'lockgate is installed'\n"
        f"sys.path.insert(1, {shipping.package_zip()!r})\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sys.modules['lockgate'].__file__)\n"
    )
    result = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert ".zip/lockgate/__init__.py" in result.stdout


class _FakeContext:
    def __init__(self, master: str) -> None:
        self.master = master
        self.added: list[str] = []
        # the workers' interpreter (SparkContext.pythonExec): the driver's own, so a
        # local master has nothing to ship (lockgate.api.shipping._local_workers_python)
        self.pythonExec = sys.executable

    def addPyFile(self, path: str) -> None:  # SparkContext's name
        self.added.append(path)


class _FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class _FakeSession:
    def __init__(self, master: str, conf: dict[str, str] | None = None) -> None:
        self.sparkContext = _FakeContext(master)
        self.conf = _FakeConf(conf or {})


def test_local_master_ships_nothing() -> None:
    spark = _FakeSession("local[2]", {shipping.SHIP_CODE_CONF: "not even read"})
    assert shipping.ship_code(spark) is False  # type: ignore[arg-type]
    assert spark.sparkContext.added == []


def test_ship_code_false_turns_it_off() -> None:
    spark = _FakeSession("spark://127.0.0.1:7077", {shipping.SHIP_CODE_CONF: "False"})
    assert shipping.ship_code(spark) is False  # type: ignore[arg-type]
    assert spark.sparkContext.added == []


def test_bad_ship_code_value_names_the_conf() -> None:
    spark = _FakeSession("spark://127.0.0.1:7077", {shipping.SHIP_CODE_CONF: "sometimes"})
    with pytest.raises(OptionError, match=r"'sometimes'.*spark\.lockgate\.shipCode"):
        shipping.ship_code(spark)  # type: ignore[arg-type]


def test_a_context_is_handled_once() -> None:
    spark = _FakeSession("spark://127.0.0.1:7077", {shipping.SHIP_CODE_CONF: "false"})
    shipping.ship_code(spark)  # type: ignore[arg-type]
    spark.conf.values[shipping.SHIP_CODE_CONF] = "true"
    assert shipping.ship_code(spark) is False  # type: ignore[arg-type]
    assert spark.sparkContext.added == []
