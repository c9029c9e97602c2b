"""Fixtures of the cluster tests: a Spark standalone master and two workers on 127.0.0.1
(``spark_standalone.py``), shared by the session; a killed worker is replaced before the
next test. The tests never touch the suite's in-process SparkSession: their drivers are
subprocesses.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from spark_standalone import StandaloneCluster


def _unavailable(reason: str) -> None:
    """Skip, except on CI (``CI=true``), where a missing prerequisite is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"cluster tests cannot run: {reason}")
    pytest.skip(f"cluster tests cannot run: {reason}")


def _check_prerequisites() -> None:
    import pyspark

    spark_class = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
    if not os.access(spark_class, os.X_OK):
        _unavailable(f"{spark_class} is missing or not executable")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        _unavailable("no 'java' on PATH and JAVA_HOME is not set")
    if not hasattr(os, "killpg"):
        _unavailable("needs POSIX process groups")


@pytest.fixture(scope="session")
def _standalone_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[StandaloneCluster, Future[None]]]:
    """The cluster, starting in the background while module fixtures (the local-mode
    reference run) do their work."""
    _check_prerequisites()
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"))
    with ThreadPoolExecutor(1, thread_name_prefix="standalone-cluster") as pool:
        started = pool.submit(cluster.start, 2)
        try:
            yield cluster, started
        finally:
            started.exception()  # no process is launched after the cluster stops
            cluster.stop()


@pytest.fixture
def standalone_cluster(
    _standalone_cluster: tuple[StandaloneCluster, Future[None]],
) -> StandaloneCluster:
    """The session's cluster with two live workers (a killed worker is replaced)."""
    cluster, started = _standalone_cluster
    started.result()
    cluster.ensure_workers(2)
    return cluster
