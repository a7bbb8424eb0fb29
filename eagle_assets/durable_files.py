"""Crash-safe file replacement shared by every stage that writes results.

Readers must see the old file or the new one, never a torn one, and a rename is only durable once
the directory entry is fsync'd too: write to a temporary sibling, fsync it, rename it over the
target, fsync the directory.
"""

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def default_tmp_name(path: Path) -> str:
    return f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb", tmp_name: str | None = None) -> Iterator[IO]:
    """Yield a file to write; on a clean exit it replaces ``path`` durably, on an error it vanishes."""
    path = Path(path)
    tmp = path.with_name(tmp_name or default_tmp_name(path))
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_bytes(path: Path, data: bytes, tmp_name: str | None = None) -> None:
    with atomic_file(path, "wb", tmp_name) as f:
        f.write(data)


@contextlib.contextmanager
def directory_lock(directory: Path, name: str) -> Iterator[None]:
    """Exclusive ``flock`` on ``directory/name`` (created with the directory): writers of one directory
    take turns, across processes, and a crashed holder's lock goes with its process."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
