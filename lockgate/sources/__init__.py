"""Streaming sources and the registry behind ``readStream.format(name)``."""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

from lockgate.errors import OptionError
from lockgate.sources.base import (
    READ_ALL_AVAILABLE,
    ReadLimit,
    Source,
    SourceContext,
    SourceProvider,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Built-in providers, imported on first use: name -> "module:attribute".
_BUILTIN: dict[str, str] = {
    "rate": "lockgate.sources.rate:RateSourceProvider",
    "rate-micro-batch": "lockgate.sources.rate:RatePerMicroBatchSourceProvider",
    "json": "lockgate.sources.file:JsonFileSourceProvider",
    "csv": "lockgate.sources.file:CsvFileSourceProvider",
    "parquet": "lockgate.sources.file:ParquetFileSourceProvider",
    "text": "lockgate.sources.file:TextFileSourceProvider",
    "orc": "lockgate.sources.file:OrcFileSourceProvider",
    "redis": "lockgate.sources.redis:RedisSourceProvider",
    "kafka": "lockgate.sources.kafka:KafkaSourceProvider",
}
_registered: dict[str, SourceProvider] = {}
_lock = threading.Lock()


def register_source(name: str, provider: SourceProvider) -> None:
    """Make ``readStream.format(name)`` create sources with ``provider``."""
    if not isinstance(provider, SourceProvider):
        raise TypeError(f"provider must be a lockgate SourceProvider, got {type(provider).__name__}")
    with _lock:
        _registered[name.lower()] = provider


def lookup_source(name: str, spark: SparkSession | None = None) -> SourceProvider:
    """The provider of ``name``: lockgate's own, then a Python data source registered
    in ``spark`` (``spark.dataSource.register``)."""
    key = name.lower()
    with _lock:
        if key in _registered:
            return _registered[key]
    if key in _BUILTIN:
        module_name, attr = _BUILTIN[key].split(":")
        provider = getattr(importlib.import_module(module_name), attr)()
        with _lock:
            _registered.setdefault(key, provider)
            return _registered[key]
    if spark is not None:
        from lockgate.sources.python_datasource import (
            PythonDataSourceProvider,
            find_python_data_source,
        )

        cls = find_python_data_source(spark, name)
        if cls is not None:
            return PythonDataSourceProvider(cls, name)
    known = sorted(set(_BUILTIN) | set(_registered))
    raise OptionError(
        f"Failed to find data source: {name}. lockgate streaming sources are: "
        f"{', '.join(known)}; register your own with lockgate.register_source(name, provider) or "
        "spark.dataSource.register(MyDataSource).",
        option="format",
    )


__all__ = [
    "READ_ALL_AVAILABLE",
    "ReadLimit",
    "Source",
    "SourceContext",
    "SourceProvider",
    "lookup_source",
    "register_source",
]
