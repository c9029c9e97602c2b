"""bench/cpu.py: the process-tree CPU probe sees what a child process burns (alive, and
after it was reaped), leaves out excluded pids, and the burner keeps a core busy and is
always stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.cpu import CLK_TCK, CpuProbe, busy_core, lockgate_hosts, tree_ticks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# spins until it has used 0.5 s of CPU (however loaded the machine), says so, then waits
# for its stdin to close
SPIN_THEN_WAIT = """
import sys, time
while time.process_time() < 0.5:
    pass
print("done", flush=True)
sys.stdin.read()
"""


def _spinner() -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", SPIN_THEN_WAIT], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "done\n"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


def test_probe_sees_cpu_of_a_child_alive_and_reaped():
    probe = CpuProbe()
    probe.start()
    proc = _spinner()
    alive = probe.observe(0)
    _end(proc)  # reaped: its CPU moves to this process's cutime
    reaped = probe.observe(1)
    assert alive is not None and reaped is not None
    per = probe.per_batch()
    # 0.5 s of the child's CPU (plus its interpreter start) and what else the tree did
    assert 0.45 <= per[0]["cpu_s"] < 5.0, per
    # reaping neither loses nor counts it twice
    assert -0.05 <= per[1]["cpu_s"] < 0.3, per
    assert alive.processes >= 2


def test_probe_leaves_out_excluded_pids():
    proc = _spinner()
    try:
        counted = tree_ticks(os.getpid())
        assert counted is not None and proc.pid in counted[1]
        probe = CpuProbe(exclude={proc.pid})
        probe.start()
        # the spinner's 0.5 s are already spent and it is not counted: only the rest of the tree
        probe.observe(0)
        assert proc.pid not in tree_ticks(probe.root, probe.exclude)[1]
        assert probe.per_batch()[0]["cpu_s"] < 0.3
    finally:
        _end(proc)


def test_per_batch_shares_a_difference_between_skipped_batches():
    probe = CpuProbe()
    probe.start()
    probe.observe(3)
    # batches 4 and 5 finished within one poll: the observation at 5 covers two batches
    probe.observations.append(type(probe.observations[-1])(5, probe.observations[-1].cpu_s + 2.0,
                                                           probe.observations[-1].wall_s + 1.0, 1))
    per = probe.per_batch()
    assert per[5] == pytest.approx({"cpu_s": 1.0, "wall_s": 0.5})
    assert per[4] == per[5]
    assert set(per) == {3, 4, 5}


def test_batches_before_the_first_observation_share_it():
    """A run whose first two batches finished before the loop first saw one: both get a
    share of the CPU since the run started (the measured batch may be the first)."""
    probe = CpuProbe()
    probe.start(first_batch=7)
    obs = probe.observations[-1]
    probe.observations.append(type(obs)(8, obs.cpu_s + 3.0, obs.wall_s + 2.0, 1))
    per = probe.per_batch()
    assert set(per) == {7, 8}
    assert per[7] == pytest.approx({"cpu_s": 1.5, "wall_s": 1.0})


def test_busy_core_burns_and_is_stopped_also_on_failure():
    with busy_core() as burner:
        assert burner is not None
        # wait until the burner has burnt 0.3 s of CPU (a real wait: it is another process)
        for _ in range(400):
            if tree_ticks(burner.pid)[0] >= 0.3 * CLK_TCK:
                break
            time.sleep(0.05)
        assert burner.proc.poll() is None
    result = burner.result
    assert burner.proc.returncode is not None
    assert result["cpu_s"] >= 0.25 and result["busy_fraction"] > 0.1, result

    with pytest.raises(RuntimeError), busy_core() as failing:
        raise RuntimeError("a benchmark failed")
    assert failing is not None and failing.proc.returncode is not None

    with busy_core(enabled=False) as none:
        assert none is None


# starts a detached "host" (in a session of its own, as lockgate's hosts are) that
# watches ``argv[1]``, spins 0.5 s of CPU and sleeps; prints its pid and exits at once, so
# the host is no longer a descendant of the test process
DETACHED_HOST = """
import subprocess, sys
host = '''
import time
while time.process_time() < 0.5:
    pass
time.sleep(60)  # stands in for lockgate.state.host
'''
p = subprocess.Popen(
    [sys.executable, "-c", host, "--watch", sys.argv[1]],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print(p.pid, flush=True)
"""


def test_the_probe_counts_lockgate_hosts_that_left_the_tree():
    out = subprocess.run(
        [sys.executable, "-c", DETACHED_HOST, str(os.getpid())], capture_output=True, text=True, check=True
    )
    host = int(out.stdout.split()[0])
    try:
        deadline = time.monotonic() + 30
        while True:
            got = tree_ticks(os.getpid())
            assert got is not None
            ticks, pids = got
            if host in pids and ticks / CLK_TCK >= 0.5:
                break
            assert time.monotonic() < deadline, (host, pids)
            time.sleep(0.1)
        # a host watching a process outside the tree is not counted
        assert host not in lockgate_hosts([os.getppid()])
    finally:
        os.kill(host, 9)


def test_a_process_leaving_the_tree_does_not_make_a_batch_cost_negative_cpu(monkeypatch):
    """A lockgate host that exits takes its ticks out of the tree's total: the batch it
    exits in counts none of the drop (the CI once saw -4.5 s for a batch after workload 7)."""
    from bench import cpu

    totals = iter([100, 300, 50, 80])
    monkeypatch.setattr(cpu, "tree_ticks", lambda root, exclude=(): (next(totals), [root]))
    probe = CpuProbe()
    probe.start(first_batch=0)
    for batch in range(3):
        probe.observe(batch)
    per = probe.per_batch()
    assert per[0]["cpu_s"] >= 200 / CLK_TCK - 0.05
    assert -0.05 <= per[1]["cpu_s"] < 0.05  # the drop counts as nothing
    assert per[2]["cpu_s"] >= 30 / CLK_TCK - 0.05
