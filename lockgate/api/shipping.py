"""Shipping lockgate's own code to the executors of a cluster.

A lockgate query runs lockgate functions inside Spark tasks (the state store, the
stateful operators' ``mapInArrow`` tasks), so the executors' Python must import
``lockgate``. On a cluster (any master but ``local``/``local[...]``), creating
``lockgate.session(spark)`` asks the executors whether they can; when they cannot, the
installed ``lockgate`` package is zipped once per driver process and added with
``SparkContext.addPyFile``. ``spark.lockgate.shipCode=false`` turns this off. In local
mode the workers run the driver's interpreter unless ``PYSPARK_PYTHON`` chooses another
(``_local_workers_python``).

Only lockgate itself is shipped: its dependencies (pyspark, pyarrow, pandas) must be
installed on the executors (``docs/cluster.md``).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import io
import logging
import os
import shutil
import sys
import tempfile
import threading
import uuid
import weakref
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from lockgate.errors import LockgateError
from lockgate.options import Options

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

SHIP_CODE_CONF = "spark.lockgate.shipCode"
"""``true`` (default): ship lockgate to executors that cannot import it; ``false``: never."""

PROBE_TIMEOUT_S = 60.0
"""How long to wait for the executors' answer (the probe job waits for executors to
register); without an answer the code is shipped."""

# A fixed timestamp keeps the zip's bytes, and so its name, a function of its contents.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)

_lock = threading.Lock()
_zip_path: str | None = None
_handled: weakref.WeakSet[SparkContext] = weakref.WeakSet()


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs the executors in the driver process (``local``, ``local[N]``,
    ``local[*]``, ``local[N, F]``); ``local-cluster[...]`` has executor processes."""
    return master == "local" or master.startswith("local[")


def ship_code(spark: SparkSession) -> bool:
    """Make ``lockgate`` importable on the executors of ``spark``'s cluster.

    Does nothing in local mode, when ``spark.lockgate.shipCode`` is ``false``, when the
    executors already import ``lockgate``, or when this SparkContext was handled before.

    Returns
    -------
    bool
        Whether the zipped package was added to the SparkContext.

    Raises
    ------
    OptionError
        ``spark.lockgate.shipCode`` is neither ``true`` nor ``false``.
    """
    try:
        sc = spark.sparkContext
    except Exception:  # noqa: BLE001 - Spark Connect sessions have no SparkContext
        return False
    if is_local_master(str(sc.master)):
        return _local_workers_python(sc)
    raw = spark.conf.get(SHIP_CODE_CONF, "true")
    enabled = Options({SHIP_CODE_CONF: raw}, owner="Spark conf").get_bool(SHIP_CODE_CONF, True)
    with _lock:
        if sc in _handled:
            return False
        shipped = False
        if not enabled:
            logger.info("Not shipping lockgate to the executors (%s=false)", SHIP_CODE_CONF)
        elif _executors_import_lockgate(sc, PROBE_TIMEOUT_S):
            logger.info("The executors import lockgate themselves; not shipping it")
        else:
            path = package_zip()
            sc.addPyFile(path)
            shipped = True
            logger.info(
                "Shipped lockgate to the executors as %s (set %s=false to turn this off)",
                os.path.basename(path),
                SHIP_CODE_CONF,
            )
        _handled.add(sc)  # only once it is done: a failure above is retried next time
        return shipped


def _same_interpreter(executable: str) -> bool:
    found = shutil.which(executable)
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)


def _local_workers_python(sc: SparkContext) -> bool:
    """In local mode, make the Python workers import lockgate, or refuse with the fix.

    PySpark starts its workers with ``sc.pythonExec``: ``$PYSPARK_PYTHON``, else
    ``python3`` from PATH, which is often not the interpreter running the driver (a venv
    run as ``.venv/bin/python app.py``, not activated). When nobody chose the workers'
    Python, local workers run the driver's own interpreter, as they would if the venv
    were activated. When ``PYSPARK_PYTHON`` names another one, it is asked (one small
    job) whether it imports lockgate and its dependencies: lockgate alone is shipped
    as on a cluster; anything else is an error naming the fix.
    """
    with _lock:
        if sc in _handled:
            return False
        shipped = False
        executable = str(sc.pythonExec)
        if not _same_interpreter(executable):
            if "PYSPARK_PYTHON" not in os.environ and executable == "python3":
                logger.info(
                    "Local Python workers run %s (the driver's interpreter) instead of "
                    "'python3' from PATH; set PYSPARK_PYTHON to choose another",
                    sys.executable,
                )
                sc.pythonExec = sys.executable
            else:
                missing = _local_workers_missing(sc)
                if missing == ["lockgate"]:
                    sc.addPyFile(package_zip())
                    shipped = True
                elif missing:
                    raise LockgateError(
                        f"The Python workers of this local SparkSession run {executable!r} "
                        f"(PYSPARK_PYTHON), which cannot import {', '.join(missing)}; lockgate "
                        "runs its state tasks there. Point PYSPARK_PYTHON at an interpreter "
                        f"that has them, e.g. this one: PYSPARK_PYTHON={sys.executable} "
                        "(set before the SparkSession is created), or install them "
                        f"into {executable!r}."
                    )
        _handled.add(sc)
        return shipped


def _local_workers_missing(sc: SparkContext) -> list[str]:
    """What the local Python workers cannot import of lockgate's needs (one task)."""

    def probe(_: object) -> list[str]:
        from importlib import util

        return [m for m in ("pyarrow", "pandas", "lockgate") if util.find_spec(m) is None]

    try:
        return list(sc.parallelize([0], 1).map(probe).collect()[0])
    except Exception as exc:  # noqa: BLE001 - e.g. PYTHON_VERSION_MISMATCH
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [f"its Python workers failed to start ({first[:300]})"]


def package_zip() -> str:
    """A zip of the installed ``lockgate`` package, built once per process in a temp dir."""
    global _zip_path
    if _zip_path is not None and os.path.exists(_zip_path):
        return _zip_path
    import lockgate

    package_dir = Path(lockgate.__file__).resolve().parent
    data = _zip_bytes(package_dir)
    directory = tempfile.mkdtemp(prefix="lockgate-ship-")
    atexit.register(shutil.rmtree, directory, True)
    # Named by content: a SparkContext refuses a second file of one name with other bytes.
    name = f"lockgate-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    _zip_path = path
    return path


def _zip_bytes(package_dir: Path) -> bytes:
    buffer = io.BytesIO()
    root = package_dir.parent
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for directory, dirnames, filenames in os.walk(package_dir):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel_dir = Path(directory).relative_to(root).as_posix()
            # Directory entries: zipimport finds namespace subpackages (no __init__.py)
            # only through them.
            dir_info = zipfile.ZipInfo(rel_dir + "/", _ZIP_DATE_TIME)
            dir_info.external_attr = (0o40755 << 16) | 0x10
            zf.writestr(dir_info, b"")
            for filename in sorted(filenames):
                if filename.endswith((".pyc", ".pyo")):
                    continue
                info = zipfile.ZipInfo(f"{rel_dir}/{filename}", _ZIP_DATE_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, (Path(directory) / filename).read_bytes())
    return buffer.getvalue()


def _executors_import_lockgate(sc: SparkContext, timeout_s: float) -> bool:
    """Whether one task per core of the registered executors finds ``lockgate``.

    ``False`` also when the probe fails or gets no answer within ``timeout_s``: shipping
    the driver's copy is then the safe choice.
    """
    from pyspark.util import InheritableThread

    group = f"lockgate-ship-probe-{uuid.uuid4().hex}"
    answer: list[bool] = []

    def probe() -> None:
        try:
            sc.setJobGroup(group, "lockgate: can the executors import lockgate?")
            tasks = max(1, sc.defaultParallelism)
            # importlib.util.find_spec is pickled by reference, so the probe itself does
            # not need lockgate on the executors.
            rdd = sc.parallelize(["lockgate"] * tasks, tasks)
            answer.append(rdd.filter(importlib.util.find_spec).count() == tasks)
        except Exception as exc:  # noqa: BLE001 - any failure means "ship it"
            logger.warning("Could not ask the executors whether they import lockgate: %s", exc)

    thread = InheritableThread(target=probe, name="lockgate code shipping probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        logger.warning(
            "The executors did not answer within %.0f s whether they import lockgate",
            timeout_s,
        )
        sc.cancelJobGroup(group)
        return False
    return bool(answer and answer[0])
