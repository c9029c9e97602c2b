"""A static DataFrame that takes a lockgate stream as its argument: ``static.join(stream)``.

PySpark's DataFrame methods hand their argument's JVM Dataset to Spark, which a lockgate
stream does not have (it is a plan of lockgate's, run batch by batch), so
``static.join(stream, "k")`` failed with ``AttributeError: _jdf``. Spark runs such a join
(inner, cross, right outer) and refuses the other set operations with a static left side.
:func:`install` wraps the methods of PySpark's classic ``DataFrame`` that take another
DataFrame: given a lockgate stream they build the lockgate plan (the join) or raise
Spark's error; given anything else they are PySpark's own, unchanged.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from lockgate.errors import AnalysisError

_installed = False
_lock = threading.Lock()

_UNION = "Union between streaming and batch DataFrames/Datasets is not supported"
_REFUSED = {
    "union": _UNION,
    "unionAll": _UNION,
    "unionByName": _UNION,
    "subtract": "Except on a streaming DataFrame/Dataset on the right is not supported",
    "exceptAll": "Except on a streaming DataFrame/Dataset on the right is not supported",
    "intersect": "Intersect of streaming DataFrames/Datasets is not supported",
    "intersectAll": "Intersect of streaming DataFrames/Datasets is not supported",
}


def _is_stream(value: Any) -> bool:
    from lockgate.api.dataframe import StreamingDataFrame

    return isinstance(value, StreamingDataFrame)


def _wrap(original: Callable[..., Any], handle: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, other: Any = None, *args: Any, **kwargs: Any) -> Any:
        if _is_stream(other):
            return handle(self, other, *args, **kwargs)
        return original(self, other, *args, **kwargs)

    method.__lockgate_original__ = original  # type: ignore[attr-defined]
    return method


def _join(static: Any, stream: Any, on: Any = None, how: str | None = None) -> Any:
    return stream._joined_by_static(static, on, how)


def _cross_join(static: Any, stream: Any) -> Any:
    return stream._joined_by_static(static, None, "cross")


def _refuse(message: str) -> Callable[..., Any]:
    def refuse(static: Any, stream: Any, *args: Any, **kwargs: Any) -> Any:
        raise AnalysisError(message)

    return refuse


def install() -> None:
    """Wrap PySpark's classic DataFrame methods once per process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        from pyspark.sql.classic.dataframe import DataFrame

        handlers: dict[str, Callable[..., Any]] = {"join": _join, "crossJoin": _cross_join}
        handlers.update({name: _refuse(message) for name, message in _REFUSED.items()})
        for name, handle in handlers.items():
            original = getattr(DataFrame, name, None)
            if original is not None and not hasattr(original, "__lockgate_original__"):
                setattr(DataFrame, name, _wrap(original, handle))
        _installed = True
