"""State files under corruption: every damaged file is caught before it is loaded; a
version whose snapshot is damaged is rebuilt from older files (and the snapshot
rewritten), anything else fails with lockgate's error naming the file, the operator,
the partition and the fix.

These drive the store as a task does, in this process, with the worker cache cleared
so every load reads the files (tests/state/test_restart_integrity.py runs the same
corruptions through a restarted query).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow as pa
import pytest

from lockgate.checkpoint.checksum import CRC32, compute
from lockgate.errors import LockgateError
from lockgate.state.store import (
    CorruptStateFileError,
    StateStore,
    StateStoreConf,
    StateStoreError,
    clear_cache,
)

BASE = 1_000_000  # counts start here: their bytes occur nowhere else in a file
KEYS = pa.schema([pa.field("k", pa.string())])
VALUES = pa.schema([pa.field("n", pa.int64())])


@pytest.fixture(autouse=True)
def _cold_cache():
    clear_cache()
    yield
    clear_cache()


def _conf(tmp_path: Path, **kwargs) -> StateStoreConf:
    return StateStoreConf(
        root=str(tmp_path / "state"),
        operator_id=3,
        num_partitions=2,
        key_schema=KEYS,
        value_schema=VALUES,
        checkpoint_id="q",
        **{"snapshot_interval": 2, **kwargs},
    )


def _counts(conf: StateStoreConf, batches: list[list[str]], partition: int = 1) -> dict[str, int]:
    """Run one batch per list (each key counted once more), return the final map."""
    counts: dict[str, int] = {}
    for version, keys in enumerate(batches):
        store = StateStore(conf, partition, version)
        for k in keys:
            n = (store.get((k,)) or [BASE])[0] + 1
            store.put((k,), [n])
            counts[k] = n
        store.commit()
    return counts


def _load(conf: StateStoreConf, version: int, partition: int = 1) -> dict[str, int]:
    clear_cache()
    return {k[0]: v[0] for k, v in StateStore(conf, partition, version).items()}


def _dir(tmp_path: Path, partition: int = 1) -> Path:
    return tmp_path / "state" / "3" / str(partition)


def _flip_count(path: Path, old: int) -> None:
    """Flip the lowest bit of the count ``BASE + old`` in the file's value buffer: the
    file stays a valid Arrow stream that holds ``(BASE + old) ^ 1``."""
    old += BASE
    raw = bytearray(path.read_bytes())
    needle = old.to_bytes(8, "little", signed=True)
    at = raw.find(needle)
    assert at >= 0 and raw.find(needle, at + 1) < 0, "the count's bytes must be unique"
    raw[at] ^= 1
    path.write_bytes(bytes(raw))
    table = pa.ipc.open_stream(pa.BufferReader(bytes(raw))).read_all()
    assert old ^ 1 in table.column("n").to_pylist()  # still valid Arrow, wrong value


BATCHES = [["a", "b"], ["a"], ["a", "c"], ["b"], ["a"]]
# versions 1..5; snapshots at 2 and 4 (snapshot_interval 2)
EXPECTED = {"a": BASE + 4, "b": BASE + 2, "c": BASE + 1}


def test_every_state_file_has_a_checksum_beside_it(tmp_path):
    conf = _conf(tmp_path)
    _counts(conf, BATCHES)
    names = sorted(os.listdir(_dir(tmp_path)))
    data = [n for n in names if not n.endswith(".crc")]
    assert data == ["1.delta", "2.delta", "2.snapshot", "3.delta", "4.delta", "4.snapshot", "5.delta"]
    assert names == sorted(data + [n + ".crc" for n in data])
    import json

    for name in data:
        stored = json.loads((_dir(tmp_path) / (name + ".crc")).read_text())
        raw = (_dir(tmp_path) / name).read_bytes()
        assert stored["algorithm"] == CRC32
        assert (stored["value"], stored["mainFileSize"]) == (compute(raw, CRC32), len(raw))


def test_bit_flip_in_snapshot_is_repaired_from_older_files(tmp_path, caplog):
    """The issue's example: one bit of a count in a snapshot flipped. Without checks the
    count comes back wrong (b=3 instead of 2); with them, version 4 is rebuilt from snapshot 2 and
    deltas 3..4, and the snapshot is rewritten."""
    conf = _conf(tmp_path)
    assert _counts(conf, BATCHES) == EXPECTED
    snapshot = _dir(tmp_path) / "4.snapshot"
    _flip_count(snapshot, 2)  # b's count at version 4 (unchanged after it): 2 -> 3
    clear_cache()
    with caplog.at_level(logging.WARNING, logger="lockgate.state.store"):
        store = StateStore(conf, 1, 5)
    assert {k[0]: v[0] for k, v in store.items()} == EXPECTED
    assert store.metrics.repaired == (str(snapshot),)
    [record] = [r for r in caplog.records if "Repaired state snapshot" in r.getMessage()]
    assert str(snapshot) in record.getMessage() and "partition 1" in record.getMessage()
    # the snapshot was rewritten: the next cold load reads it without a repair
    clear_cache()
    again = StateStore(conf, 1, 5)
    assert again.metrics.repaired == ()
    assert {k[0]: v[0] for k, v in again.items()} == EXPECTED


def test_every_snapshot_corrupt_rebuilds_from_the_deltas(tmp_path):
    conf = _conf(tmp_path)
    _counts(conf, BATCHES)
    (_dir(tmp_path) / "4.snapshot").write_bytes(b"garbage")
    (_dir(tmp_path) / "2.snapshot").write_bytes((_dir(tmp_path) / "2.snapshot").read_bytes()[:-9])
    assert _load(conf, 5) == EXPECTED


@pytest.mark.parametrize(
    "damage",
    ["bit flip", "truncated", "garbage over the header", "empty", "middle bytes flipped"],
)
def test_corrupt_delta_fails_naming_file_operator_partition_and_fix(tmp_path, damage):
    """A delta after the newest snapshot has no other copy: the load fails with
    lockgate's error, never a bare pyarrow error, and never loads the file."""
    conf = _conf(tmp_path)
    _counts(conf, BATCHES)
    delta = _dir(tmp_path) / "5.delta"
    raw = bytearray(delta.read_bytes())
    if damage == "bit flip":
        _flip_count(delta, 4)  # a's count in batch 4: 4 -> 5
        raw = bytearray(delta.read_bytes())
    elif damage == "truncated":
        raw = raw[: len(raw) // 2]
    elif damage == "garbage over the header":
        raw[:16] = b"\xff" * 16
    elif damage == "empty":
        raw = bytearray()
    else:
        middle = len(raw) // 2
        raw[middle : middle + 8] = bytes(b ^ 0xFF for b in raw[middle : middle + 8])
    delta.write_bytes(bytes(raw))
    with pytest.raises(CorruptStateFileError) as info:
        _load(conf, 5)
    message = str(info.value)
    assert isinstance(info.value, LockgateError)
    assert info.value.path == str(delta)
    assert str(delta) in message
    assert "stateful operator 3 partition 1" in message
    assert "Checksum verification failed" in message
    assert "new checkpoint location" in message


@pytest.mark.parametrize("damage", ["truncated", "garbage over the header", "middle bytes flipped"])
def test_unreadable_file_without_checksum_is_lockgates_error(tmp_path, damage):
    """A checkpoint written before checksums (no .crc files) loads unverified; damage
    Arrow notices still surfaces as lockgate's error naming the file, not as pyarrow's
    ArrowInvalid or bare OSError."""
    conf = _conf(tmp_path)
    _counts(conf, BATCHES)
    for crc in _dir(tmp_path).glob("*.crc"):
        crc.unlink()
    assert _load(conf, 5) == EXPECTED  # old checkpoints still load
    delta = _dir(tmp_path) / "5.delta"
    raw = bytearray(delta.read_bytes())
    if damage == "truncated":
        raw = raw[: len(raw) - 20]
    elif damage == "garbage over the header":
        raw[:16] = b"\x00\x01" * 8
    else:
        raw[40:200] = b"\xa5" * 160
    delta.write_bytes(bytes(raw))
    with pytest.raises(CorruptStateFileError, match="stateful operator 3 partition 1") as info:
        _load(conf, 5)
    assert str(delta) in str(info.value)


def test_missing_delta_fails_naming_file_and_fix(tmp_path):
    conf = _conf(tmp_path)
    _counts(conf, BATCHES)
    (_dir(tmp_path) / "5.delta").unlink()
    with pytest.raises(StateStoreError, match="5.delta is missing") as info:
        _load(conf, 5)
    assert "stateful operator 3 partition 1" in str(info.value)
    assert "new checkpoint location" in str(info.value)


def test_corrupt_checksum_file_is_not_trusted(tmp_path):
    """Damage to the .crc itself: the file cannot be verified, so it is not loaded; a
    snapshot is rebuilt, a delta fails."""
    conf = _conf(tmp_path)
    _counts(conf, BATCHES)
    (_dir(tmp_path) / "4.snapshot.crc").write_bytes(b"{not json")
    assert _load(conf, 5) == EXPECTED
    (_dir(tmp_path) / "5.delta.crc").write_bytes(b'{"algorithm":"CRC32","value":1}')
    with pytest.raises(CorruptStateFileError, match="5.delta"):
        _load(conf, 5)


def test_stale_checksum_of_a_rewritten_file_is_never_left(tmp_path):
    """A re-run batch rewrites its delta: the old .crc is removed before the file is
    replaced, so a crash between the two writes leaves an unverified file, not a file
    beside someone else's checksum."""
    conf = _conf(tmp_path)
    _counts(conf, BATCHES[:1])
    store = StateStore(conf, 1, 0)
    store.put(("z",), [9])
    store.commit()  # re-run of batch 0 with other content
    assert _load(conf, 1) == {"z": 9}
    assert _load(conf, 1) == {"z": 9}


def test_maintenance_removes_leftovers_of_cut_off_writes(tmp_path):
    conf = _conf(tmp_path)
    _counts(conf, BATCHES[:3])
    directory = _dir(tmp_path)
    tmp = directory / ".4.delta.0123abcd.tmp"
    tmp.write_bytes(b"half a file")
    orphan = directory / "17.delta.crc"
    orphan.write_text("{}")
    _counts(conf, [[], [], [], ["x"]])  # versions 1..4 again; 4 writes a snapshot
    names = os.listdir(directory)
    assert tmp.name not in names and orphan.name not in names
    assert "4.snapshot" in names and "4.snapshot.crc" in names


def test_corrupt_snapshot_and_the_delta_a_rebuild_needs_names_the_delta(tmp_path):
    conf = _conf(tmp_path)
    _counts(conf, BATCHES)
    (_dir(tmp_path) / "4.snapshot").write_bytes(b"garbage")
    delta = _dir(tmp_path) / "3.delta"
    delta.write_bytes(delta.read_bytes()[:-1])
    with pytest.raises(CorruptStateFileError) as info:
        _load(conf, 5)
    assert info.value.path == str(delta)
    assert str(info.value).startswith(f"State file {delta} of stateful operator 3 partition 1 is corrupt")
    assert f"Corrupt snapshots skipped before it: {_dir(tmp_path) / '4.snapshot'}" in str(info.value)
