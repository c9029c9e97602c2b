"""Memory of the driver, the JVM and the Python workers while a workload runs."""

from __future__ import annotations

import os
import time
from typing import Any

from bench.cpu import lockgate_hosts


# -- memory ----------------------------------------------------------------------------------
def _status_kb(pid: int | str, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return _status_kb(pid, "VmRSS")


def _reset_hwm(pid: int | str) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _is_python_worker(pid: int) -> bool:
    """PySpark's daemon and its forked workers (not short-lived helpers the JVM forks,
    which briefly share the JVM's pages)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    # forked workers keep the daemon's command line; a JVM helper fork has java's
    return b"pyspark.daemon" in cmdline and b"java" not in cmdline.split(b"\0", 1)[0]


class MemoryProbe:
    """Peaks of: this Python driver's RSS (VmHWM), the JVM's RSS (VmHWM), JVM heap used
    (sampled), and the Python workers' PSS (sampled; Spark's forked executor workers,
    where lockgate's state lives)."""

    def __init__(self, spark: Any) -> None:
        jvm = spark.sparkContext._jvm
        self.runtime = jvm.java.lang.Runtime.getRuntime()
        self.system = jvm.java.lang.System
        try:
            self.jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # noqa: BLE001 - a remote JVM: no /proc figures for it
            self.jvm_pid = -1
        self.heap_max_mb = self.runtime.maxMemory() / 2**20
        self.reset()

    def reset(self) -> None:
        _reset_hwm("self")
        if self.jvm_pid > 0:
            _reset_hwm(self.jvm_pid)
        self.heap_peak = 0
        self.workers_peak = 0
        self._last = 0.0
        self.sample(force=True)

    def heap_used(self) -> int:
        return int(self.runtime.totalMemory()) - int(self.runtime.freeMemory())

    def workers_pss(self) -> int:
        if self.jvm_pid <= 0:
            return 0
        tree = _descendants(self.jvm_pid)
        workers = [p for p in tree if _is_python_worker(p)]
        # state hosts (lockgate's state steps) and the Kafka producer host count as workers
        workers += [p for p in lockgate_hosts(tree) if p not in workers]
        return sum(_pss_kb(p) for p in workers) * 1024

    def sample(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.25:
            return
        self._last = now
        self.heap_peak = max(self.heap_peak, self.heap_used())
        self.workers_peak = max(self.workers_peak, self.workers_pss())

    def peaks(self) -> dict[str, float]:
        self.sample(force=True)
        return {
            "driver_rss_peak_mb": _status_kb("self", "VmHWM") / 1024,
            "jvm_rss_peak_mb": _status_kb(self.jvm_pid, "VmHWM") / 1024 if self.jvm_pid > 0 else 0.0,
            "jvm_heap_peak_mb": self.heap_peak / 2**20,
            "workers_pss_peak_mb": self.workers_peak / 2**20,
        }

    def now(self, gc: bool = False) -> dict[str, float]:
        if gc:
            self.system.gc()
            time.sleep(0.5)
        return {
            "driver_rss_mb": _status_kb("self", "VmRSS") / 1024,
            "jvm_rss_mb": _status_kb(self.jvm_pid, "VmRSS") / 1024 if self.jvm_pid > 0 else 0.0,
            "jvm_heap_used_mb": self.heap_used() / 2**20,
            "workers_pss_mb": self.workers_pss() / 2**20,
        }
