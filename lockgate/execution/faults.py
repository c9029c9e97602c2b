"""Crash points for recovery tests.

Set ``LOCKGATE_TEST_KILL_AT=<phase>:<batchId>`` in a query's process and the engine
kills that process with SIGKILL when batch ``batchId`` reaches ``phase``:
``after_wal`` (offsets written, nothing else), ``after_sink`` (sink written, commit
not), ``after_commit``. Unset, each point is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

_ENV = "LOCKGATE_TEST_KILL_AT"


def crash_point(phase: str, batch_id: int) -> None:
    spec = os.environ.get(_ENV)
    if not spec:
        return
    want_phase, _, want_batch = spec.partition(":")
    if want_phase == phase and want_batch == str(batch_id):
        os.kill(os.getpid(), signal.SIGKILL)
