"""The row codec of continuous payloads (a sink's commit message, a driver-fed source's
records), shared by the continuous engine, sinks and sources: a restricted pickle of plain
values (tuples, lists, numbers, strings, bytes, ``None`` and ``Decimal``); unpickling
anything else (a class, a function) is refused. Nothing in this format is persisted: it
travels between continuous tasks and the driver only
(:mod:`lockgate.execution.continuous.protocol` frames it).
"""

from __future__ import annotations

import io
import pickle
from decimal import Decimal
from typing import Any


def encode_rows(rows: Any) -> bytes:
    return pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "decimal" and name == "Decimal":
            return Decimal
        raise pickle.UnpicklingError(
            f"continuous payloads carry plain values only, not {module}.{name}"
        )


def decode_rows(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()
