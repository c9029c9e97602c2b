"""Options of file sources: Spark's ``FileStreamOptions`` and the option helpers.

:class:`FileStreamOptions` parses and checks the options the source itself consumes;
:func:`reader_options` picks the rest, which go on to ``spark.read``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lockgate.errors import OptionError

if TYPE_CHECKING:
    from lockgate.options import Options

# Options the source itself consumes; every other option goes to ``spark.read``.
_STREAM_ONLY_OPTIONS = frozenset(
    name.lower()
    for name in (
        "path",
        "maxFilesPerTrigger",
        "maxBytesPerTrigger",
        "latestFirst",
        "fileNameOnly",
        "maxFileAge",
        "cleanSource",
        "sourceArchiveDir",
        "maxCachedFiles",
        "discardCachedInputRatio",
    )
)


@dataclass(frozen=True)
class FileStreamOptions:
    """The options Spark's ``FileStreamOptions`` reads, parsed and checked."""

    max_files_per_trigger: int | None
    max_bytes_per_trigger: int | None
    latest_first: bool
    file_name_only: bool
    max_file_age_ms: int
    clean_source: str
    """``"off"``, ``"archive"`` or ``"delete"``."""
    source_archive_dir: str | None

    @classmethod
    def parse(cls, options: Options) -> FileStreamOptions:
        for key in ("modifiedBefore", "modifiedAfter"):  # batch reads' file filters
            if options.get_str(key) is not None:
                raise OptionError(
                    f"option '{key.lower()}' is not allowed in file stream sources. A file "
                    "stream source reads each new file once; to leave old files out, use "
                    "'maxFileAge' (or 'latestFirst' with 'maxFilesPerTrigger').",
                    option=key,
                )
        max_files = _positive_int(options, "maxFilesPerTrigger")
        max_bytes = _positive_int(options, "maxBytesPerTrigger")
        if max_files is not None and max_bytes is not None:
            raise OptionError(
                "Options 'maxFilesPerTrigger' and 'maxBytesPerTrigger' can't be both set at "
                "the same time",
                option="maxBytesPerTrigger",
            )
        max_age = options.get_time_ms("maxFileAge", 7 * 86_400_000)
        assert max_age is not None
        if max_age < 0:
            raise OptionError(
                f"Invalid value {options.get_str('maxFileAge')!r} for option 'maxFileAge': "
                "it must not be negative.",
                option="maxFileAge",
            )
        archive_dir = options.get_str("sourceArchiveDir")
        raw_mode = options.get_str("cleanSource", "off") or "off"
        mode = raw_mode.strip().lower()
        if mode not in ("off", "archive", "delete"):
            raise OptionError(
                f"Invalid mode for clean source option {raw_mode}. Must be one of "
                "ARCHIVE,DELETE,OFF",
                option="cleanSource",
            )
        if mode == "archive" and not archive_dir:
            raise OptionError(
                "Archive mode must be used with 'sourceArchiveDir' option.",
                option="sourceArchiveDir",
            )
        return cls(
            max_files_per_trigger=max_files,
            max_bytes_per_trigger=max_bytes,
            latest_first=options.get_bool("latestFirst", False),
            file_name_only=options.get_bool("fileNameOnly", False),
            max_file_age_ms=max_age,
            clean_source=mode,
            source_archive_dir=archive_dir,
        )


def _positive_int(options: Options, key: str) -> int | None:
    raw = options.get_str(key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(
            f"Invalid value {raw!r} for option {key!r}, must be a positive integer",
            option=key,
        )
    return value


def reader_options(options: Options) -> dict[str, str]:
    """The options passed on to ``spark.read`` (format options such as ``mode``)."""
    return {k: v for k, v in options.as_dict().items() if k.lower() not in _STREAM_ONLY_OPTIONS}


def require_path(options: Options) -> str:
    path = options.get_str("path")
    if not path:
        raise OptionError("'path' is not specified", option="path")
    return path
