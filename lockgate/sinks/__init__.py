"""Streaming sinks and the registry behind ``writeStream.format(name)``."""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

from lockgate.errors import OptionError
from lockgate.sinks.base import OUTPUT_MODES, Sink, SinkContext, SinkProvider

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_BUILTIN: dict[str, str] = {
    "console": "lockgate.sinks.console:ConsoleSinkProvider",
    "memory": "lockgate.sinks.memory:MemorySinkProvider",
    "noop": "lockgate.sinks.noop:NoopSinkProvider",
    "parquet": "lockgate.sinks.file:ParquetFileSinkProvider",
    "json": "lockgate.sinks.file:JsonFileSinkProvider",
    "csv": "lockgate.sinks.file:CsvFileSinkProvider",
    "orc": "lockgate.sinks.file:OrcFileSinkProvider",
    "text": "lockgate.sinks.file:TextFileSinkProvider",
    "redis": "lockgate.sinks.redis:RedisSinkProvider",
    "kafka": "lockgate.sinks.kafka:KafkaSinkProvider",
}
_registered: dict[str, SinkProvider] = {}
_lock = threading.Lock()


def register_sink(name: str, provider: SinkProvider) -> None:
    """Make ``writeStream.format(name)`` write with ``provider``."""
    if not isinstance(provider, SinkProvider):
        raise TypeError(f"provider must be a lockgate SinkProvider, got {type(provider).__name__}")
    with _lock:
        _registered[name.lower()] = provider


def lookup_sink(name: str, spark: SparkSession | None = None) -> SinkProvider:
    """The provider of ``name``: lockgate's own, then a Python data source registered
    in ``spark`` (``spark.dataSource.register``), written with its ``streamWriter``."""
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
        from lockgate.sinks.python_datasource import PythonDataSourceSinkProvider
        from lockgate.sources.python_datasource import find_python_data_source

        cls = find_python_data_source(spark, name)
        if cls is not None:
            return PythonDataSourceSinkProvider(cls, name)
    known = sorted(set(_BUILTIN) | set(_registered) | {"foreach", "foreachBatch"})
    raise OptionError(
        f"Failed to find data source: {name}. lockgate streaming sinks are: "
        f"{', '.join(known)}; register your own with lockgate.register_sink(name, provider) or "
        "spark.dataSource.register(MyDataSource).",
        option="format",
    )


__all__ = ["OUTPUT_MODES", "Sink", "SinkContext", "SinkProvider", "lookup_sink", "register_sink"]
