"""CPU seconds of a process tree, from ``/proc``, and a bounded CPU burner for contention.

The benchmark runs both engines in one process tree: this Python driver (lockgate's engine
threads live here), the JVM it launched (native Spark's engine, the executors' tasks),
PySpark's daemon under the JVM and the Python workers it forks, and lockgate's host
processes (the state hosts that run its state steps, the Kafka sink's producer host),
which a worker starts in a session of their own and which leave the tree when that
worker exits: they are counted by the daemon they watch (:func:`lockgate_hosts`).
:class:`CpuProbe` sums ``utime + stime`` of every live process of that tree and
``cutime + cstime`` (the CPU of children already waited for: a Python worker that exited,
a helper the JVM forked), so the difference between two observations is the CPU the tree
spent in between, whichever process spent it.

Linux only; elsewhere the probe reports nothing (``None``) and the benchmarks go on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # not a POSIX system with /proc
    CLK_TCK = 100


def _stat(pid: str) -> tuple[int, int, bytes] | None:
    """(ppid, utime + stime + cutime + cstime in clock ticks, command name) of one
    process, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    head, tail = text.rsplit(b")", 1)
    fields = tail.split()
    # fields[0] is field 3 (state); ppid is field 4, utime..cstime are fields 14..17
    ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return int(fields[1]), ticks, head.split(b"(", 1)[-1]


def tree_ticks(root: int, exclude: Iterable[int] = ()) -> tuple[int, list[int]] | None:
    """CPU clock ticks of ``root`` and its descendants (their subtrees left out for the pids
    in ``exclude``), and the pids counted; None without ``/proc``."""
    if not os.path.isdir("/proc"):
        return None
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    pythons: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(name)
        if st is None:
            continue
        pid = int(name)
        children.setdefault(st[0], []).append(pid)
        ticks[pid] = st[1]
        if st[2].startswith(b"python"):
            pythons.append(pid)
    if root not in ticks:
        return None
    skip = set(exclude)
    counted: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        counted.append(pid)
        todo.extend(children.get(pid, []))
    counted += [p for p in lockgate_hosts(counted, pythons) if p not in counted]
    return sum(ticks.get(p, 0) for p in counted), counted


HOST_MODULES = (b"lockgate.state.host", b"lockgate.sinks.kafka_host")


def lockgate_hosts(tree: Iterable[int], candidates: Iterable[int] | None = None) -> list[int]:
    """lockgate's host processes (state hosts, the Kafka sink's producer host) serving a
    PySpark daemon in ``tree``: a worker starts them in a session of their own, so once
    that worker exits they are no longer its descendants, but their CPU and memory are
    the engine's."""
    tree = set(tree)
    if candidates is None:
        candidates = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    hosts = []
    for pid in candidates:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if not any(m in a for a in args[:3] for m in HOST_MODULES) or b"--watch" not in args:
            continue
        watched = args[args.index(b"--watch") + 1] if args.index(b"--watch") + 1 < len(args) else b""
        if watched.isdigit() and int(watched) in tree:
            hosts.append(pid)
    return hosts


@dataclass
class Observation:
    """The tree's CPU seconds at one moment (the probe's own CPU already taken out)."""

    batch_id: int
    cpu_s: float
    wall_s: float
    processes: int


@dataclass
class CpuProbe:
    """CPU seconds of this process's tree, observed when the round loop sees a new batch.

    ``observe(batch_id)`` records the tree's CPU at that moment; ``per_batch()`` gives each
    observed batch the CPU spent since the previous observation, divided by the batches
    between them (two batches that finished within one poll share the difference). The
    first observation (``start()``, right after the query started) has no batch.

    The CPU of the thread that calls the probe (the benchmark's polling loop) is taken
    out: the probe's own ``/proc`` scan and the loop's polling are the harness's, the same
    for both engines, and would pull their ratio towards 1. What the loop's calls cost
    elsewhere (the JVM answering ``lastProgress`` over py4j) stays in.
    """

    root: int = field(default_factory=os.getpid)
    exclude: set[int] = field(default_factory=set)
    observations: list[Observation] = field(default_factory=list)
    harness_cpu_s: float = 0.0
    _thread_cpu0: float = 0.0
    _first_batch: int | None = None

    @property
    def available(self) -> bool:
        return tree_ticks(self.root, self.exclude) is not None

    def start(self, first_batch: int | None = None) -> None:
        """Start observing a query run whose first batch will be ``first_batch`` (None:
        unknown; the first observed batch then has the CPU since now to itself)."""
        self.observations = []
        self.harness_cpu_s = 0.0
        self._thread_cpu0 = time.thread_time()
        self._first_batch = first_batch
        self.observe(-1)

    def observe(self, batch_id: int) -> Observation | None:
        got = tree_ticks(self.root, self.exclude)
        if got is None:
            return None
        total, pids = got
        # The tree's ticks never count as going down: a process that leaves the tree
        # unreaped by it (a lockgate host that exits) takes its ticks with it. (A child
        # the tree reaps moves its ticks to its parent's cutime: no change.)
        if not self.observations:
            self._ticks = total
        else:
            self._ticks += max(0, total - self._last_total)
        self._last_total = total
        # the calling thread's CPU since start(), this scan included, is the harness's
        self.harness_cpu_s = time.thread_time() - self._thread_cpu0
        obs = Observation(batch_id, self._ticks / CLK_TCK - self.harness_cpu_s, time.perf_counter(), len(pids))
        self.observations.append(obs)
        return obs

    def per_batch(self) -> dict[int, dict[str, float]]:
        """``{batch_id: {"cpu_s": ..., "wall_s": ...}}`` for every observed batch that had
        an earlier observation in the same run."""
        out: dict[int, dict[str, float]] = {}
        for prev, cur in zip(self.observations, self.observations[1:], strict=False):
            if cur.batch_id < 0:
                continue
            if prev.batch_id >= 0:
                first = prev.batch_id + 1
            elif self._first_batch is not None:
                first = self._first_batch
            else:
                first = cur.batch_id
            first = min(first, cur.batch_id)
            span = cur.batch_id - first + 1
            share = {"cpu_s": (cur.cpu_s - prev.cpu_s) / span, "wall_s": (cur.wall_s - prev.wall_s) / span}
            # batches that finished within one poll share the difference, each its share
            for batch_id in range(first, cur.batch_id + 1):
                out[batch_id] = share
        return out


# -- contention ---------------------------------------------------------------------------------
_SPIN = """
import os, sys, time
deadline = time.monotonic() + float(sys.argv[1])
parent = os.getppid()
x = 0
while time.monotonic() < deadline and os.getppid() == parent:
    for _ in range(200_000):
        x += 1
"""


@dataclass
class Burner:
    """A process spinning on one core: started by :func:`busy_core`, which always stops it."""

    proc: subprocess.Popen[bytes]
    core: int | None
    started: float
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> dict[str, Any]:
        """Stop the burner (if it still runs) and return its CPU and wall seconds."""
        if self.result:
            return self.result
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            cpu = usage.ru_utime + usage.ru_stime
        except ChildProcessError:  # already reaped by poll()
            cpu = float("nan")
        wall = time.perf_counter() - self.started
        self.result = {"pid": self.proc.pid, "core": self.core, "cpu_s": cpu, "wall_s": wall,
                       "busy_fraction": cpu / wall if wall > 0 else float("nan")}
        return self.result


def _last_core() -> int | None:
    try:
        return max(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


@contextmanager
def busy_core(enabled: bool = True, max_seconds: float = 6 * 3600, core: int | None = None) -> Iterator[Burner | None]:
    """Keep one core busy while the block runs: a separate Python process spinning, pinned to
    ``core`` (default the highest core this process may use), stopped when the block ends,
    also on an exception. It also stops by itself after ``max_seconds`` and when this process
    dies (it watches its parent). Yields the :class:`Burner` (or None when not ``enabled``);
    its ``result`` holds the CPU it burnt once the block has ended."""
    if not enabled:
        yield None
        return
    core = _last_core() if core is None else core
    proc = subprocess.Popen([sys.executable, "-c", _SPIN, str(max_seconds)], stdin=subprocess.DEVNULL)
    burner = Burner(proc, core, time.perf_counter())
    try:
        if core is not None:
            try:
                os.sched_setaffinity(proc.pid, {core})
            except OSError:
                burner.core = None
        yield burner
    finally:
        burner.stop()
