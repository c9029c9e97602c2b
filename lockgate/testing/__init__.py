"""Test doubles for lockgate users: a memory source and a manual clock."""

from lockgate.clock import ManualClock
from lockgate.sources.memory import MemoryStream

__all__ = ["ManualClock", "MemoryStream"]
