"""A Spark standalone cluster on 127.0.0.1 for tests: a master and workers, each its
own process group, started from pyspark's bundled launcher (``bin/spark-class``).

The workers' Python (``PYSPARK_PYTHON``, also given to the drivers of the tests) is a
wrapper that runs this interpreter with ``-S`` and a copy of site-packages without
lockgate on ``PYTHONPATH``: pyspark, pyarrow and pandas are importable on the
executors, lockgate is not, so a query only works if lockgate ships itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 120
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=2"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal ``proc``'s whole process group (it was started in a new session)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM the group, then SIGKILL what is left; reap ``proc``."""
    kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # The group may outlive its leader (executors, Python daemons): always SIGKILL it.
    kill_group(proc, signal.SIGKILL)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def executor_python(root: Path) -> Path:
    """A ``python`` for the executors that cannot import lockgate (see module doc)."""
    import pyspark

    site = Path(pyspark.__file__).resolve().parent.parent
    shadow = root / "site-without-lockgate"
    shadow.mkdir(parents=True)
    for entry in site.iterdir():
        name = entry.name
        if name.startswith(("lockgate", "__editable__")) or name.endswith(".pth"):
            continue
        (shadow / name).symlink_to(entry)
    wrapper = root / "executor-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# -S: no site module, so no .pth files (an editable lockgate install is one)\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{shadow}"\n'
        "export PYTHONPATH\n"
        f'exec "{sys.executable}" -S "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@dataclass
class Worker:
    index: int
    work_dir: Path
    log: Path
    webui_port: int
    proc: subprocess.Popen[bytes]
    killed: bool = False


class StandaloneCluster:
    """A master and workers on 127.0.0.1; ``master_url`` is ``spark://127.0.0.1:<port>``."""

    def __init__(self, root: Path) -> None:
        import pyspark

        self.root = root
        self.spark_home = Path(pyspark.__file__).resolve().parent
        self.spark_class = self.spark_home / "bin" / "spark-class"
        self.python = executor_python(root)
        self.port = free_port()
        self.webui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.master: subprocess.Popen[bytes] | None = None
        self.master_log = root / "master.log"
        self.workers: list[Worker] = []
        conf_dir = root / "conf"
        conf_dir.mkdir()
        self.properties = conf_dir / "spark-defaults.conf"
        # The REST submission server would take the fixed port 6066.
        self.properties.write_text("spark.master.rest.enabled false\n")
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "SPARK_CONF_DIR", "SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS")
        }
        self.env.update(
            SPARK_HOME=str(self.spark_home),
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS=DAEMON_JAVA_OPTS,
            PYSPARK_PYTHON=str(self.python),
        )

    def _launch(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                [str(self.spark_class), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=str(self.root),
                start_new_session=True,
            )

    def start(self, workers: int = 2) -> None:
        self.master = self._launch(
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--webui-port", str(self.webui_port),
                "--properties-file", str(self.properties),
            ],
            self.master_log,
        )  # fmt: skip
        # A worker that registers before the master is elected retries only ~10 s later.
        self.wait_for_master()
        for _ in range(workers):
            self.start_worker()
        self.wait_for_workers()

    def wait_for_master(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.state().get("status") == "ALIVE":
                    return
            except (OSError, ValueError):
                pass
            assert self.master is not None
            if self.master.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the master did not start\n{self.logs()}")
            time.sleep(0.1)

    def start_worker(self) -> Worker:
        index = len(self.workers)
        work_dir = self.root / f"worker-{index}"
        work_dir.mkdir()
        log = self.root / f"worker-{index}.log"
        webui_port = free_port()
        proc = self._launch(
            [
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host", "127.0.0.1",
                "--cores", "1",
                "--memory", "1g",
                "--work-dir", str(work_dir),
                "--webui-port", str(webui_port),
                "--properties-file", str(self.properties),
            ],
            log,
        )  # fmt: skip
        worker = Worker(index, work_dir, log, webui_port, proc)
        self.workers.append(worker)
        return worker

    def state(self) -> dict[str, object]:
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read().decode("utf-8"))

    def registered(self) -> set[int]:
        """Web UI ports of the workers the master lists as ALIVE."""
        try:
            workers = self.state().get("workers", [])
        except (OSError, ValueError):
            return set()
        ports = set()
        for w in workers:  # type: ignore[attr-defined]
            if w.get("state") == "ALIVE":
                ports.add(int(str(w.get("webuiaddress", "")).rsplit(":", 1)[-1] or 0))
        return ports

    def wait_for_workers(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every running worker process has registered with the master."""
        deadline = time.monotonic() + timeout_s
        while not {w.webui_port for w in self.running_workers()} <= self.registered():
            exited = [p.args for p in self.processes() if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the workers did not register with {self.master_url} (exited: "
                    f"{exited})\n{self.logs()}"
                )
            time.sleep(0.25)

    def running_workers(self) -> list[Worker]:
        return [w for w in self.workers if not w.killed]

    def ensure_workers(self, count: int = 2) -> None:
        """Replace killed workers, so each test starts with ``count`` live workers."""
        for _ in range(count - len(self.running_workers())):
            self.start_worker()
        self.wait_for_workers()

    def kill_worker(self, worker: Worker) -> None:
        """SIGKILL a worker with its executors and their Python workers."""
        worker.killed = True
        kill_group(worker.proc)
        worker.proc.wait(timeout=30)

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The master and the workers not killed on purpose."""
        return ([self.master] if self.master else []) + [w.proc for w in self.running_workers()]

    def logs(self) -> str:
        parts = [f"--- master ---\n{_tail(self.master_log)}"]
        parts += [f"--- worker {w.index} ---\n{_tail(w.log)}" for w in self.workers]
        return "\n".join(parts)

    def stop(self) -> None:
        for worker in self.workers:
            stop_group(worker.proc)
        if self.master is not None:
            stop_group(self.master)
