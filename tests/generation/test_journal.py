import os

import pytest

from eagle_assets.generation.journal import (
    Journal,
    JournalError,
    JournalLockedError,
    decode_line,
    encode_line,
    read_records,
    scan,
)
from tests.generation.forked import CTX, process


def rec(i: int) -> dict:
    return {"prompt_id": f"p{i}", "status": "ok", "content": f"text {i} ✓"}


def test_roundtrip_and_dedup(tmp_path):
    path = tmp_path / "j.journal"
    with Journal(path) as j:
        assert j.append_many([rec(1), rec(2)]) == [rec(1), rec(2)]
        # A prompt already journaled is never written twice.
        assert j.append_many([rec(2), rec(3)]) == [rec(3)]
    assert [r["prompt_id"] for r in read_records(path)] == ["p1", "p2", "p3"]
    with Journal(path) as j:
        assert len(j) == 3 and "p2" in j and "p9" not in j


def test_a_skip_may_be_followed_by_a_later_record_a_kept_answer_never(tmp_path):
    path = tmp_path / "j.journal"
    skip = {"prompt_id": "p1", "status": "skipped", "error_class": "bad_request", "final": False}
    with Journal(path) as j:
        assert j.append_many([skip, rec(2)]) == [skip, rec(2)]
        # The skipped prompt asked again: its answer follows the skip; the kept one is never replaced.
        assert j.append_many([rec(1), {**rec(2), "content": "again"}]) == [rec(1)]
        assert j.records["p1"] == rec(1)
    assert read_records(path) == [rec(1), rec(2)]  # one record per prompt, the kept answer
    assert len(scan(path).records) == 3
    with Journal(path) as j:
        assert j.records["p1"]["status"] == "ok" and j.append_many([skip]) == []


@pytest.mark.parametrize("cut", [1, 5, 9, 20, -2, -1])
def test_torn_tail_is_dropped_and_truncated(tmp_path, cut):
    path = tmp_path / "j.journal"
    with Journal(path) as j:
        j.append_many([rec(1), rec(2)])
    good = path.read_bytes()
    torn = encode_line(rec(3))[:cut]
    path.write_bytes(good + torn)
    result = scan(path)
    assert [r["prompt_id"] for r in result.records] == ["p1", "p2"]
    assert result.dropped_bytes == len(torn)
    with Journal(path) as j:
        assert j.dropped_bytes == len(torn) and len(j) == 2
        j.append_many([rec(3)])
    assert path.read_bytes() == good + encode_line(rec(3))


def test_checksum_mismatch_is_not_data(tmp_path):
    line = encode_line(rec(1))
    flipped = line.replace(b"text 1", b"text 7")
    assert decode_line(line) == rec(1)
    assert decode_line(flipped) is None


def test_corruption_before_tail_is_fatal(tmp_path):
    path = tmp_path / "j.journal"
    bad = encode_line(rec(1)).replace(b"text", b"tExt")
    path.write_bytes(bad + encode_line(rec(2)))
    with pytest.raises(JournalError, match="line 1"):
        scan(path)


def _try_lock(path, q):
    try:
        Journal(path)
        q.put("locked-ok")
    except JournalLockedError:
        q.put("refused")


def test_second_writer_is_refused(tmp_path):
    path = tmp_path / "j.journal"
    with Journal(path):
        q = CTX.Queue()
        p = process(_try_lock, path, q)
        p.start()
        p.join(30)
        assert q.get(timeout=5) == "refused"
    # Once released, another writer may open it.
    with Journal(path):
        pass
    assert os.path.exists(path)
