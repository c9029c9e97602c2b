"""Streaming sinks and the registry behind ``writeStream.format(name)``."""

from __future__ import annotations

import importlib
import threading

from lockgate.errors import OptionError
from lockgate.sinks.base import OUTPUT_MODES, Sink, SinkContext, SinkProvider

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


def lookup_sink(name: str) -> SinkProvider:
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
    known = sorted(set(_BUILTIN) | set(_registered) | {"foreach", "foreachBatch"})
    raise OptionError(
        f"Failed to find data source: {name}. lockgate streaming sinks are: "
        f"{', '.join(known)}; register your own with lockgate.register_sink(name, provider).",
        option="format",
    )


__all__ = ["OUTPUT_MODES", "Sink", "SinkContext", "SinkProvider", "lookup_sink", "register_sink"]
