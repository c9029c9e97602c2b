"""What a query's batches can share: expressions and schemas that do not change.

Building a batch's DataFrame from PySpark is a sequence of py4j round trips to the
driver's JVM: every ``F.col``, ``F.lit`` or ``alias`` is one to three of them, every
``df.schema`` one more plus a JSON parse. Most of what lockgate builds per batch is the
same every batch: a Column made from ``pyspark.sql.functions`` is an unresolved
expression bound to no DataFrame, so one Column object serves every batch's DataFrame,
and a plan node's output schema is the same whenever its sources' batches have the same
shape. :class:`PlanCache` keeps those for the lifetime of one query run, keyed by the
plan node (or other owner) that built them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

T = TypeVar("T")


class PlanCache:
    """Values built once per query run and reused by every batch.

    Owners are long-lived objects of the running query (plan nodes, the execution),
    identified by ``id``; the cache lives exactly as long as they do.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[int, str], Any] = {}
        self._schemas: dict[tuple[int, str, Hashable], StructType] = {}

    def get(self, owner: object, name: str, make: Callable[[], T]) -> T:
        """The value ``make()`` built for ``(owner, name)`` the first time it was asked."""
        key = (id(owner), name)
        try:
            return self._values[key]  # type: ignore[no-any-return]
        except KeyError:
            value = self._values[key] = make()
            return value

    def prime_schema(self, owner: object, shape: Hashable, df: DataFrame, part: str = "") -> DataFrame:
        """Give ``df`` the schema a DataFrame of the same node (and ``part`` of it) had in
        an earlier batch of the same shape, so ``df.schema`` and ``df.columns`` cost no
        round trip. Returns ``df``."""
        schema = self._schemas.get((id(owner), part, shape))
        if schema is not None and "schema" not in df.__dict__:
            # DataFrame.schema is a functools.cached_property: its instance entry wins.
            df.__dict__["schema"] = schema
        return df

    def remember_schema(self, owner: object, shape: Hashable, df: DataFrame, part: str = "") -> StructType:
        """``df.schema``, kept for the next batches of the same shape."""
        schema = df.schema
        self._schemas.setdefault((id(owner), part, shape), schema)
        return schema
