"""The writer side of a store: ``index.json`` (settings check, what is done, what was committed).

A shard file is recorded in ``index.json`` only once it is renamed into place, and the index is replaced whole,
under a file lock and a lease in the ledger's database, so that extraction processes on several hosts can share a
store. On rerun, a shard whose file is whole and made from the current corpus shard is kept, even if the crash
came between rename and index update; anything else is deleted and recomputed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from eagle_assets.durable_files import atomic_write_bytes, host_tag, pid_alive
from eagle_assets.generation.database_lease import DatabaseLease
from eagle_assets.generation.folder_lease import exclusive
from eagle_assets.hidden_states.samples import HiddenStateSample, input_fingerprint
from eagle_assets.hidden_states.shard_file import ShardWriter, read_shard_header, swept_tmp_name
from eagle_assets.hidden_states.store_format import (
    FORMAT,
    FORMAT_VERSION,
    INDEX_NAME,
    LOCK_NAME,
    StoreError,
    StoreMeta,
    StoreMismatchError,
    shard_file_name,
    shard_name,
)

# An index update takes milliseconds: a writer that waits this long for another has met a stuck one.
INDEX_LEASE_WAIT_S = 600.0


def remove_stale_temporaries(directory: Path) -> None:
    """Delete the ``*.tmp-<host>-<pid>-*`` files that dead processes of this host left (another host's are its own)."""
    for p in directory.glob("*.tmp-*"):
        host, _, rest = p.name.rsplit(".tmp-", 1)[1].partition("-")
        pid = rest.partition("-")[0]
        if host == host_tag() and pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)) and p.is_file():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


class StoreWriter:
    """Owns ``index.json`` for writers: checks settings, decides what is done, records commits."""

    def __init__(
        self,
        directory: str | Path,
        meta: StoreMeta,
        *,
        lease_location: str | Path | None = None,
        lease_wait_s: float = INDEX_LEASE_WAIT_S,
    ):
        self.directory = Path(directory).expanduser().absolute()
        self.meta = meta
        self.lease_location = lease_location  # the ledger holding the index's lease; None: the configured one
        self.lease_wait_s = lease_wait_s
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.directory)
        with self._index_writer() as lease:
            index = self._read_index()
            if index is None:
                lease.check()
                self._write_index({**meta.to_index(), "shards": {}})
            else:
                self._check_identity(index)

    def _index_writer(self) -> contextlib.AbstractContextManager[DatabaseLease]:
        """``index.json`` is read, changed and replaced whole: one writer at a time, on every host (its ``flock``
        and its lease in the ledger's database, which GPU workers on other hosts wait for)."""
        what = f"the hidden-state store index {self.directory / INDEX_NAME}"
        return exclusive(self.directory, LOCK_NAME, what=what, location=self.lease_location, wait_s=self.lease_wait_s)

    def _write_index(self, doc: Mapping[str, Any]) -> None:
        atomic_write_bytes(self.directory / INDEX_NAME, _dump(doc), swept_tmp_name(INDEX_NAME))

    def _read_index(self) -> dict[str, Any] | None:
        p = self.directory / INDEX_NAME
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise StoreError(f"{p} is not valid JSON ({exc}); it is only ever replaced atomically") from exc

    def _check_identity(self, index: Mapping[str, Any]) -> None:
        existing = StoreMeta.from_index(index).identity()
        wanted = self.meta.identity()
        if existing != wanted:
            diff = {k: (existing.get(k), wanted.get(k)) for k in wanted if existing.get(k) != wanted.get(k)}
            raise StoreMismatchError(
                f"{self.directory} holds features written with other settings {diff} (existing, requested); "
                "use another directory or delete this store"
            )

    def shard_metadata(self, index: int, key: str, group: Sequence[str], samples: Sequence[HiddenStateSample]) -> dict:
        return {
            "format": f"{FORMAT}/{FORMAT_VERSION}",
            "shard_index": str(index),
            "shard_key": key,
            "features": json.dumps(list(group)),
            "identity": json.dumps(self.meta.identity(), sort_keys=True),
            "input_fingerprint": input_fingerprint(samples),
            "sample_ids": json.dumps([s.sample_id for s in samples]),
        }

    def is_complete(self, index: int, key: str, group: Sequence[str], samples: Sequence[HiddenStateSample]) -> bool:
        """True when the group's file for this shard is whole and was made from exactly these inputs."""
        path = self.directory / shard_file_name(index, group, self.meta.features)
        header = read_shard_header(path)
        if header is None:
            return False
        md = header.get("__metadata__", {})
        want = self.shard_metadata(index, key, group, samples)
        if any(md.get(k) != want[k] for k in ("format", "features", "identity", "input_fingerprint")):
            return False
        return all(
            name in header and header[name]["shape"] == [sum(len(s) for s in samples), self.meta.width(name)]
            for name in group
        )

    def discard(self, index: int, group: Sequence[str], *, listed: bool = True) -> None:
        """Remove an incomplete or stale file (and its index entry, if ``listed``) before recomputing it."""
        name = shard_file_name(index, group, self.meta.features)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / name).unlink()
        if not listed:
            return
        with self._index_writer() as lease:
            index_doc = self._read_index() or {**self.meta.to_index(), "shards": {}}
            entry = index_doc["shards"].get(shard_name(index))
            if entry and name in entry.get("files", {}):
                del entry["files"][name]
                lease.check()
                self._write_index(index_doc)

    def open_shard(
        self, index: int, key: str, group: Sequence[str], samples: Sequence[HiddenStateSample]
    ) -> ShardWriter:
        return ShardWriter(
            self.directory,
            shard_file_name(index, group, self.meta.features),
            self.meta,
            group,
            samples,
            self.shard_metadata(index, key, group, samples),
        )

    def record(self, index: int, key: str, group: Sequence[str], samples: Sequence[HiddenStateSample]) -> None:
        """Enter a committed (or recovered) file in ``index.json``; idempotent."""
        name = shard_file_name(index, group, self.meta.features)
        size = (self.directory / name).stat().st_size
        lengths = [len(s) for s in samples]
        offsets = list(accumulate(lengths, initial=0))[:-1]
        with self._index_writer() as lease:
            doc = self._read_index() or {**self.meta.to_index(), "shards": {}}
            self._check_identity(doc)
            sid = shard_name(index)
            fp = input_fingerprint(samples)
            entry = doc["shards"].get(sid)
            if entry is None or entry.get("input_fingerprint") != fp:
                entry = {
                    "index": index,
                    "key": key,
                    "input_fingerprint": fp,
                    "n_samples": len(samples),
                    "n_tokens": sum(lengths),
                    "sample_ids": [s.sample_id for s in samples],
                    "offsets": offsets,
                    "lengths": lengths,
                    "files": {},
                }
            entry["files"][name] = {"features": list(group), "bytes": size}
            entry["complete"] = sorted(f for fi in entry["files"].values() for f in fi["features"]) == sorted(
                self.meta.features
            )
            doc["shards"][sid] = entry
            doc["shards"] = dict(sorted(doc["shards"].items()))
            lease.check()
            self._write_index(doc)


def _dump(doc: Mapping[str, Any]) -> bytes:
    """Readable store metadata, one line per shard: the index is rewritten after every shard, and
    an indented per-sample list would triple its size (~40 bytes per sample this way)."""
    head = {k: v for k, v in doc.items() if k != "shards"}
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]  # reopen the object: drop "\n}"
    shards = doc.get("shards", {})
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False, separators=(',', ':'))}" for k, v in shards.items()]
    body = ",\n".join(lines)
    return (text + ',\n "shards": {' + ("\n" + body + "\n " if lines else "") + "}\n}\n").encode()
