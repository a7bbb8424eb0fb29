"""A partition's parquet and sidecars are published under its fence: a host that lost the partition cannot
overwrite what the run that took it over published.

host-a takes the partition and journals one answer, then stalls (its heartbeat stops, as in a long pause);
host-b waits out host-a's lease, takes the partition over, journals a second answer and publishes. When host-a
comes back and publishes what it believes is the partition, the fence refuses before any file is replaced.
"""

from pathlib import Path

import polars as pl
import pytest

from eagle_assets.assets.generation import record_providers_fenced, write_parquet_fenced
from eagle_assets.generation.journal import Journal
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.partition_fence import FenceLostError
from eagle_assets.generation.partition_sidecars import read_allowed_providers
from eagle_assets.layout import allowed_providers_path, partition_paths

LEASE_S = 3.0


def _answer(prompt_id: str, provider: str) -> dict[str, object]:
    return {
        "prompt_id": prompt_id,
        "status": "ok",
        "messages": [{"role": "user", "content": prompt_id}],
        "content": f"answer to {prompt_id}",
        "finish_reason": "stop",
        "provider": provider,
        "completion_tokens": 3,
    }


def _ledger_on(host: str, location: str | Path, monkeypatch: pytest.MonkeyPatch) -> BudgetLedger:
    monkeypatch.setenv("EAGLE_FORGE_HOST_ID", host)
    return BudgetLedger(location, lease_s=LEASE_S)


def test_a_host_that_lost_its_partition_cannot_overwrite_the_successors_outputs(ledger_at, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EAGLE_FORGE_JOURNAL_FLOCK", "0")  # as on a mount without flock: the fence alone holds
    loc = ledger_at("l")
    journal, parquet = partition_paths("B1", "0000")
    a, b = _ledger_on("host-a", loc, monkeypatch), _ledger_on("host-b", loc, monkeypatch)
    stale = a.partition_fence("B1/0000").acquire()
    with Journal(journal, stale) as j:
        j.append_many([_answer("p1", "prov-a")])
    a.heartbeat.stop()  # host-a stalls: its lease runs out
    with b.partition_fence("B1/0000") as fence:
        assert fence.token == 2 and fence.took_over is not None and "host-a" in fence.took_over
        with Journal(journal, fence) as j:
            j.append_many([_answer("p2", "prov-b")])
        assert record_providers_fenced(fence, "B1", "0000", ["prov-b"]) == ["prov-b"]
        assert write_parquet_fenced(fence, journal, parquet) == 2
    published = (parquet.read_bytes(), allowed_providers_path("B1", "0000").read_bytes())
    # host-a comes back and publishes from its own view: refused before either file is touched.
    with pytest.raises(FenceLostError, match="B1/0000"):
        record_providers_fenced(stale, "B1", "0000", ["prov-a"])
    with pytest.raises(FenceLostError, match="B1/0000"):
        write_parquet_fenced(stale, journal, parquet)
    assert (parquet.read_bytes(), allowed_providers_path("B1", "0000").read_bytes()) == published
    assert read_allowed_providers("B1", "0000") == ["prov-b"]
    assert sorted(pl.read_parquet(parquet)["prompt_id"].to_list()) == ["p1", "p2"]
    b.close()
