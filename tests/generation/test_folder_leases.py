"""One writer per shared folder across hosts: the corpus merge and a hidden-state store's index.

As in ``test_leases``, "hosts" are process trees with their own ``EAGLE_FORGE_HOST_ID``, and ``flock`` is turned
off (``EAGLE_FORGE_FLOCK=0``), as on an NFS mount that does not honour it: what keeps the second writer out is
the lease in the ledger's database alone. The other host's writer is a real process holding the folder's lease
through the same ``exclusive`` the merge and the store take.
"""

import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from eagle_assets.corpus.merge import _LOCK_NAME as MERGE_LOCK
from eagle_assets.corpus.merge import INDEX_NAME, MergeConfig, MergeResult, merge_corpus
from eagle_assets.generation.database_lease import LeaseBusyError
from eagle_assets.generation.folder_lease import folder_lease_name
from eagle_assets.generation.ledger.database import open_database
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.store_format import INDEX_NAME as STORE_INDEX
from eagle_assets.hidden_states.store_format import LOCK_NAME as STORE_LOCK
from eagle_assets.hidden_states.store_format import StoreMeta
from eagle_assets.hidden_states.store_writer import StoreWriter
from tests.corpus.helpers import tokenized_dataset
from tests.generation.forked import CTX, process
from tests.generation.holders import hold_folder

CFG = MergeConfig(seed=7, eval_count=5, max_samples_per_shard=30, max_tokens_per_shard=10_000_000, batch_rows=8)


@pytest.fixture
def host_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process is host-a, without flock, with a short lease; the home (shared with host-b) is returned."""
    home = tmp_path / "home"
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(home))
    monkeypatch.setenv("EAGLE_FORGE_HOST_ID", "host-a")
    monkeypatch.setenv("EAGLE_FORGE_FLOCK", "0")
    monkeypatch.setenv("EAGLE_FORGE_LEASE_S", "3")
    return home


def _start_holder(location, directory: Path, lock_name: str):
    parent, child = CTX.Pipe()
    proc = process(hold_folder, location, str(directory), lock_name, child, daemon=True)
    proc.start()
    if not parent.poll(60):
        raise AssertionError("host-b never took the lease")
    kind, token, pid = parent.recv()
    assert kind == "holding" and token >= 1
    return proc, parent, pid


def _lease_row(location, directory: Path) -> tuple[str | None, int]:
    db = open_database(location)
    try:
        with db.read() as cur:
            row = cur.execute(
                "SELECT holder, token FROM partition_leases WHERE partition = ?", (folder_lease_name(directory),)
            ).fetchone()
            return row[0], row[1]
    finally:
        db.close()


def _owners_on(location, host: str) -> int:
    db = open_database(location)
    try:
        with db.read() as cur:
            return int(cur.execute("SELECT COUNT(*) FROM owners WHERE host = ?", (host,)).fetchone()[0])
    finally:
        db.close()


def _refusal_names(exc: pytest.ExceptionInfo[LeaseBusyError], pid: int) -> None:
    text = str(exc.value)
    assert "host-b" in text and f"pid {pid}" in text and "holding it since" in text, text


def test_a_merge_waits_for_another_hosts_merge_and_is_refused_when_it_does_not_end(ledger_at, host_a, tmp_path):
    loc, out = ledger_at("l"), host_a / "corpus"
    sources = tokenized_dataset(tmp_path / "src", datasets=("B1",), shards=2, n=20)
    proc, conn, pid = _start_holder(loc, out, MERGE_LOCK)
    try:
        with pytest.raises(LeaseBusyError) as refused:
            merge_corpus(sources, out, CFG, lease_location=loc, lease_wait_s=0.5)
        _refusal_names(refused, pid)
        assert not (out / INDEX_NAME).exists() and list(out.rglob("*.parquet")) == []
        # A merge that may wait: it opens its ledger owner and stays behind host-b's lease, writing nothing ...
        result: list[MergeResult] = []
        waiting = threading.Thread(
            target=lambda: result.append(merge_corpus(sources, out, CFG, lease_location=loc, lease_wait_s=60))
        )
        owners_before = _owners_on(loc, "host-a")
        waiting.start()
        while _owners_on(loc, "host-a") == owners_before and waiting.is_alive():
            waiting.join(0.05)
        assert waiting.is_alive() and not (out / INDEX_NAME).exists()
        # ... until host-b gives it back: then it merges, under the next token.
        conn.send(None)
        waiting.join(60)
        assert conn.recv() == "released"
        assert len(result) == 1 and not result[0].skipped and (out / INDEX_NAME).exists()
        assert _lease_row(loc, out) == (None, 2)
    finally:
        proc.kill()


def _meta() -> StoreMeta:
    return StoreMeta(model_id="fake", hidden_size=8, layers=AuxLayers.default(7), dtype=torch.float32)


def test_a_store_index_writer_on_another_host_keeps_this_one_out_until_its_lease_lapses(ledger_at, host_a):
    loc, store = ledger_at("l"), host_a / "hidden_states" / "train-00000"
    proc, _conn, pid = _start_holder(loc, store, STORE_LOCK)
    try:
        with pytest.raises(LeaseBusyError) as refused:
            StoreWriter(store, _meta(), lease_location=loc, lease_wait_s=0.5)
        _refusal_names(refused, pid)
        assert not (store / STORE_INDEX).exists()
        # host-b dies holding it: this writer waits out its lease (3 s), takes over with the next token, writes.
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        StoreWriter(store, _meta(), lease_location=loc, lease_wait_s=60)
        assert (store / STORE_INDEX).exists()
        assert _lease_row(loc, store) == (None, 2)
    finally:
        proc.kill()
