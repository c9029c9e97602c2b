"""Test doubles for lockgate users: a memory source and a manual clock (also exported as
``lockgate.MemoryStream`` and ``lockgate.ManualClock``)."""

from lockgate.testing.clock import ManualClock
from lockgate.testing.memory import MemoryStream

__all__ = ["ManualClock", "MemoryStream"]
