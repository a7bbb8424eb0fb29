"""Durable, append-only journal of finished prompts, one file per partition.

A response only "counts" once its journal line is fsync'd: the ledger is settled and progress reported after the
commit, never before. Each line carries a CRC, so a record torn by a crash is dropped (its prompt redone) instead
of read as data. A file lock keeps one writer; where the file system does not honour it across hosts (NFS), a
*fence* (``partition_fence``, a lease in the ledger's database) is checked before every append.
"""

import errno
import fcntl
import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from eagle_assets.errors import GenerationError
from eagle_assets.settings import current_settings

log = logging.getLogger(__name__)


class JournalError(GenerationError, RuntimeError):
    """The journal cannot be used safely (corruption before the tail, or a second writer)."""


class JournalLockedError(JournalError):
    """Another process is already writing this partition."""


class Fence(Protocol):
    def check(self) -> None:
        """Raise unless this writer may still append."""


# flock answers these where the file system has no working lock (NFS without lockd, some FUSE mounts).
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


def flock_enabled() -> bool:
    return current_settings().journal_flock


def encode_line(record: dict[str, Any]) -> bytes:
    payload = orjson.dumps(record)
    return b"%08x " % zlib.crc32(payload) + payload + b"\n"


def decode_line(line: bytes) -> dict[str, Any] | None:
    """Return the record, or None when the line is torn or fails its checksum."""
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(payload):
            return None
        record = orjson.loads(payload)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


@dataclass
class JournalScan:
    records: list[dict[str, Any]]
    good_bytes: int
    dropped_bytes: int


def scan(path: Path) -> JournalScan:
    """Read every intact record; a damaged tail is reported, damage before the tail is fatal."""
    if not path.exists():
        return JournalScan([], 0, 0)
    data = path.read_bytes()
    records: list[dict[str, Any]] = []
    offset = 0
    for lineno, line in enumerate(data.splitlines(keepends=True), start=1):
        record = decode_line(line)
        if record is None:
            rest = data[offset + len(line) :]
            if any(decode_line(x) is not None for x in rest.splitlines(keepends=True)):
                raise JournalError(f"{path}: corrupt record at line {lineno} followed by valid records")
            return JournalScan(records, offset, len(data) - offset)
        records.append(record)
        offset += len(line)
    return JournalScan(records, offset, 0)


def supersedes(earlier: dict[str, Any] | None) -> bool:
    """Whether a record may follow ``earlier`` for the same prompt: only a skip is ever asked again (after a
    request-wide error, or with ``reask_skipped``); a kept answer is final (a crash can never make a duplicate
    count)."""
    return earlier is None or earlier.get("status") != "ok"


def read_records(path: Path) -> list[dict[str, Any]]:
    """Intact records, one per prompt id: its kept answer, else its latest skip (in first-seen order)."""
    out: dict[str | None, dict[str, Any]] = {}  # a record without an id (none is written so) keys None
    for record in scan(path).records:
        pid = record.get("prompt_id")
        if supersedes(out.get(pid)):
            out[pid] = record
    return list(out.values())


class Journal:
    """Exclusive writer for one partition's journal file.

    ``fence``: checked before every append (and must already be held when the journal is opened, since
    opening may truncate a torn tail).
    """

    def __init__(self, path: Path, fence: Fence | None = None) -> None:
        self.path = path
        self._fence = fence
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._locked = False
        if flock_enabled():
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._locked = True
            except BlockingIOError as exc:
                os.close(self._fd)
                raise JournalLockedError(f"{path} is locked by another run of this partition") from exc
            except OSError as exc:
                if exc.errno not in _NO_LOCKS or fence is None:
                    os.close(self._fd)
                    raise JournalError(
                        f"{path}: the file system refuses flock ({exc.strerror}); with no database fence nothing"
                        " keeps a second writer out. Use a PostgreSQL ledger (EAGLE_FORGE_DATABASE_URL)."
                    ) from exc
                log.warning(
                    "journal %s: no flock on this file system (%s); the database fence alone holds", path, exc.strerror
                )
        result = scan(path)
        if result.dropped_bytes:
            log.warning(
                "journal %s: dropped a torn tail of %d bytes; its prompt will be redone",
                path,
                result.dropped_bytes,
            )
            os.ftruncate(self._fd, result.good_bytes)
            os.fsync(self._fd)
        self.dropped_bytes = result.dropped_bytes
        self.records: dict[str, dict[str, Any]] = {}
        for record in result.records:
            if supersedes(self.records.get(record["prompt_id"])):
                self.records[record["prompt_id"]] = record

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.records

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records.values())

    def __len__(self) -> int:
        return len(self.records)

    def append_many(self, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Write and fsync a batch (group commit); returns the records that were new (a prompt's first, or
        one after its skip)."""
        fresh = [r for r in records if supersedes(self.records.get(r["prompt_id"]))]
        if not fresh:
            return []
        if self._fence is not None:
            self._fence.check()
        buf = b"".join(encode_line(r) for r in fresh)
        view = memoryview(buf)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)
        for r in fresh:
            self.records[r["prompt_id"]] = r
        return fresh

    def close(self) -> None:
        if self._fd >= 0:
            if self._locked:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
