"""Redis stream entry IDs and the source's offsets.

An entry ID is ``<milliseconds>-<sequence>``, both unsigned 64-bit, ordered as the pair.
The source's offset is one ID per stream: the last entry *already read* (``0-0``
before the first entry, which Redis never hands out). It is written to the offsets log
as a JSON object in the order of the ``streams`` option::

    {"orders":"1700000000000-0","payments":"0-0"}

and batch ``N`` reads, per stream, the entries with ``start < id <= end``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from lockgate.errors import OptionError

MAX_PART = 2**64 - 1
_ID = re.compile(r"^(\d+)-(\d+)$")


@dataclass(frozen=True, order=True)
class EntryId:
    """A stream entry ID, comparable as Redis orders them.

    >>> EntryId.parse("5-1") < EntryId.parse("10-0")
    True
    >>> str(EntryId.parse("5-1").next())
    '5-2'
    """

    ms: int
    seq: int

    @classmethod
    def parse(cls, text: str | bytes) -> EntryId:
        """Parse ``"<ms>-<seq>"``; raises :class:`ValueError` on anything else."""
        raw = text.decode("ascii", "replace") if isinstance(text, bytes) else str(text)
        m = _ID.match(raw.strip())
        if not m:
            raise ValueError(f"{raw!r} is not a stream entry ID of the form <ms>-<seq>")
        ms, seq = int(m.group(1)), int(m.group(2))
        if ms > MAX_PART or seq > MAX_PART:
            raise ValueError(f"{raw!r} is out of range for a stream entry ID")
        return cls(ms, seq)

    def next(self) -> EntryId:
        """The smallest ID after this one: XRANGE's exclusive start, on any Redis version."""
        if self.seq < MAX_PART:
            return EntryId(self.ms, self.seq + 1)
        return EntryId(self.ms + 1, 0)

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


ZERO = EntryId(0, 0)
"""Before every entry: the start offset of ``earliest``."""

LATEST = "latest"
EARLIEST = "earliest"

StartSpec = EntryId | str
"""One stream's starting position: an :class:`EntryId` (read after it) or ``"latest"``."""


def parse_streams(value: str | None) -> tuple[str, ...]:
    """The ``streams`` option: comma-separated stream keys, in partition order."""
    if value is None or not value.strip():
        raise OptionError(
            "Option 'streams' is required: the stream keys to read, comma-separated, e.g. "
            "option('streams', 'orders,payments').",
            option="streams",
        )
    names = tuple(part.strip() for part in value.split(","))
    if any(not name for name in names):
        raise OptionError(
            f"Invalid value {value!r} for option 'streams': a stream key is empty; list the "
            "keys separated by single commas, e.g. 'orders,payments'.",
            option="streams",
        )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise OptionError(
            f"Invalid value {value!r} for option 'streams': {', '.join(duplicates)} listed "
            "more than once; list each stream key once.",
            option="streams",
        )
    return names


def parse_starting_offsets(value: str | None, streams: tuple[str, ...]) -> dict[str, StartSpec]:
    """The ``startingOffsets`` option, resolved per stream.

    ``earliest`` (the default) and ``latest`` apply to every stream; a JSON object gives
    each stream its own: an entry ID to read *after* (as ``XREAD`` does), or
    ``"earliest"``/``"latest"`` (``-2``/``-1`` as in Kafka's option). A JSON object must
    name every stream of ``streams`` and no other.
    """
    if value is None or value.strip().lower() == EARLIEST:
        return dict.fromkeys(streams, ZERO)
    text = value.strip()
    if text.lower() == LATEST:
        return dict.fromkeys(streams, LATEST)
    bad = OptionError(
        f"Invalid value {value!r} for option 'startingOffsets': expected 'earliest', "
        "'latest' or a JSON object of an entry ID per stream, e.g. "
        '{"orders": "1700000000000-0", "payments": "earliest"}.',
        option="startingOffsets",
    )
    try:
        parsed = json.loads(text)
    except ValueError:
        raise bad from None
    if not isinstance(parsed, dict):
        raise bad
    unknown = sorted(set(parsed) - set(streams))
    missing = [s for s in streams if s not in parsed]
    if unknown or missing:
        detail = []
        if missing:
            detail.append(f"missing {', '.join(missing)}")
        if unknown:
            detail.append(f"not in option 'streams': {', '.join(unknown)}")
        raise OptionError(
            f"Invalid value {value!r} for option 'startingOffsets': a JSON object must give "
            f"a starting ID for every stream of option 'streams' ({', '.join(streams)}) and "
            f"no other ({'; '.join(detail)}).",
            option="startingOffsets",
        )
    out: dict[str, StartSpec] = {}
    for stream in streams:
        out[stream] = _parse_start(stream, parsed[stream], value)
    return out


def _parse_start(stream: str, raw: Any, option_value: str) -> StartSpec:
    if raw == -2 or (isinstance(raw, str) and raw.strip().lower() == EARLIEST):
        return ZERO
    if raw == -1 or (isinstance(raw, str) and raw.strip().lower() == LATEST):
        return LATEST
    if isinstance(raw, str):
        try:
            return EntryId.parse(raw)
        except ValueError:
            pass
    raise OptionError(
        f"Invalid value {option_value!r} for option 'startingOffsets': {raw!r} for stream "
        f'{stream!r} is not an entry ID. Use a full ID such as "1700000000000-0" (reading '
        'starts after it), "earliest" or "latest".',
        option="startingOffsets",
    )


def offsets_to_json(offsets: dict[str, EntryId]) -> dict[str, str]:
    return {stream: str(entry_id) for stream, entry_id in offsets.items()}


def offsets_from_json(value: Any) -> dict[str, EntryId]:
    """An offset as the engine hands it back (parsed JSON) -> IDs per stream."""
    if not isinstance(value, dict):
        raise TypeError(f"a Redis source offset is a JSON object, got {value!r}")
    return {str(stream): EntryId.parse(entry_id) for stream, entry_id in value.items()}
