"""The shared crash-safe writes and directory publication (``eagle_assets/durable_files.py``).

What matters is what a reader can observe: a file is the old one or the new one, and a published name
resolves to one whole version at every moment, through any number of publications and after a crash at
any point of one.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eagle_assets import durable_files as df
from eagle_assets.durable_files import (
    atomic_path,
    atomic_write_text,
    current_version,
    prune_versions,
    publish_directory,
    publishing_directory,
    stage_directory,
    versions_dir,
)

REPO = Path(__file__).resolve().parents[1]


def test_atomic_text_and_path_writes_replace_whole_or_not_at_all(tmp_path):
    path = tmp_path / "f.json"
    atomic_write_text(path, '{"a": "é"}')
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": "é"}
    with atomic_path(path) as tmp:  # a writer that wants a path
        assert tmp.parent == tmp_path and tmp != path
        tmp.write_text('{"a": 2}')
        assert json.loads(path.read_text()) == {"a": "é"}  # untouched until the clean exit
    assert json.loads(path.read_text()) == {"a": 2}
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("torn")
        raise RuntimeError("crash")
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temporaries left


def _config(n: int) -> bytes:
    payload = f"version {n} " + "x" * (4096 + n)  # more than one write's worth, so a torn file would show
    return json.dumps({"n": n, "payload": payload, "sha": hashlib.sha256(payload.encode()).hexdigest()}).encode()


def _fill(folder: Path, n: int) -> None:
    (folder / "export").mkdir()
    (folder / "export" / "config.json").write_bytes(_config(n))
    (folder / "export-vllm").symlink_to("export", target_is_directory=True)  # as draft/latest has it
    (folder / "marker").write_text(str(n))


def _read_whole(path: Path) -> int:
    d = json.loads(path.read_bytes())
    assert hashlib.sha256(d["payload"].encode()).hexdigest() == d["sha"], "partial config"
    return int(d["n"])


def test_readers_never_see_a_missing_or_partial_folder_while_publishing(tmp_path):
    latest = tmp_path / "draft" / "latest"
    with publishing_directory(latest) as staged:
        _fill(staged, 0)
    rounds = 150
    done = threading.Event()
    seen: list[list[int]] = [[] for _ in range(3)]
    failures: list[BaseException] = []

    def read(mine: list[int]) -> None:
        try:
            while not done.is_set():
                for name in ("export", "export-vllm"):
                    mine.append(_read_whole(latest / name / "config.json"))
                assert latest.is_dir()
        except BaseException as exc:  # reported below
            failures.append(exc)

    readers = [threading.Thread(target=read, args=(mine,)) for mine in seen]
    for t in readers:
        t.start()
    try:
        for n in range(1, rounds + 1):
            # grace 0: even pruning as eagerly as it can, the current and previous versions stay
            with publishing_directory(latest, grace_s=0) as staged:
                _fill(staged, n)
            if failures:
                break
    finally:
        done.set()
        for t in readers:
            t.join()
    assert not failures, f"a reader failed: {failures[0]!r}"
    for mine in seen:
        assert mine == sorted(mine)  # a reader never goes back to an older version
    assert len({n for mine in seen for n in mine}) > 10  # the readers ran while versions changed
    assert _read_whole(latest / "export" / "config.json") == rounds
    assert latest.is_symlink() and not Path(os.readlink(latest)).is_absolute()  # the tree can be moved
    left = sorted(p.name for p in versions_dir(latest).iterdir() if not p.name.startswith("."))
    assert len(left) == 2  # the current one and the one before it; the others were cleaned


def test_a_crash_at_any_point_of_a_publication_leaves_the_previous_version(tmp_path, monkeypatch):
    latest = tmp_path / "latest"
    with publishing_directory(latest) as staged:
        _fill(staged, 1)
    # 1. the builder fails half-way: nothing of it stays
    with pytest.raises(RuntimeError), publishing_directory(latest) as staged:
        (staged / "export").mkdir()
        (staged / "export" / "config.json").write_bytes(_config(2)[:100])
        raise RuntimeError("builder crashed")
    assert _read_whole(latest / "export-vllm" / "config.json") == 1
    assert not [p for p in versions_dir(latest).iterdir() if p.name.startswith(".tmp-")]

    # 2. the publisher dies between making the version and swapping the link
    def crash(*args: object) -> None:
        raise OSError("killed before the swap")

    with monkeypatch.context() as m:
        m.setattr(df, "_swap_link", crash)
        with pytest.raises(OSError, match="before the swap"), publishing_directory(latest) as staged:
            _fill(staged, 2)
    assert _read_whole(latest / "export" / "config.json") == 1
    published = current_version(latest)
    assert published is not None and (published / "marker").read_text() == "1"

    # 3. the process is killed outright while building (no finally runs)
    script = (
        "import sys; from pathlib import Path; from eagle_assets.durable_files import stage_directory\n"
        "s = stage_directory(Path(sys.argv[1])); (s / 'marker').write_text('3'); import os; os._exit(1)"
    )
    subprocess.run([sys.executable, "-c", script, str(latest)], cwd=REPO, check=False)
    assert [p for p in versions_dir(latest).iterdir() if p.name.startswith(".tmp-")]  # the dead builder's
    assert _read_whole(latest / "export" / "config.json") == 1

    # the next publication sweeps both leftovers: the unpublished version (grace 0) and the dead staging folder
    with publishing_directory(latest, grace_s=0) as staged:
        _fill(staged, 4)
    assert _read_whole(latest / "export" / "config.json") == 4
    left = [p for p in versions_dir(latest).iterdir() if p.name != ".lock"]
    assert sorted((p / "marker").read_text() for p in left) == ["1", "4"]


def test_a_resolved_version_outlives_its_replacement_for_the_grace_period(tmp_path):
    latest = tmp_path / "latest"
    with publishing_directory(latest) as staged:
        _fill(staged, 1)
    held = latest.resolve()  # an engine that resolved the name and is still loading from it
    for n in (2, 3, 4):
        with publishing_directory(latest, grace_s=3600) as staged:
            _fill(staged, n)
    assert _read_whole(held / "export" / "config.json") == 1
    time.sleep(0.01)
    removed = prune_versions(latest, grace_s=0)
    assert held.name in {p.name for p in removed} and not held.exists()
    assert _read_whole(latest / "export" / "config.json") == 4
    assert sorted((p / "marker").read_text() for p in versions_dir(latest).iterdir() if p.is_dir()) == ["3", "4"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "move-aside"])
def test_a_real_folder_from_the_old_layout_is_adopted_once(tmp_path, monkeypatch, exchange):
    latest = tmp_path / "latest"
    latest.mkdir()
    _fill(latest, 1)
    if not exchange:
        monkeypatch.setattr(df, "_exchange", lambda a, b: False)
    staged = stage_directory(latest)
    _fill(staged, 2)
    version = publish_directory(latest, staged)
    assert latest.is_symlink() and latest.resolve() == version.resolve()
    assert _read_whole(latest / "export-vllm" / "config.json") == 2
    old = [p for p in versions_dir(latest).iterdir() if p.name.endswith("-legacy")]
    assert len(old) == 1 and (old[0] / "marker").read_text() == "1"  # kept as the previous version
    assert old[0].name < version.name
    with publishing_directory(latest, grace_s=0) as staged:
        _fill(staged, 3)
    assert sorted((p / "marker").read_text() for p in versions_dir(latest).iterdir() if p.is_dir()) == ["2", "3"]


def test_a_staged_folder_belongs_to_its_public_name(tmp_path):
    staged = stage_directory(tmp_path / "a")
    with pytest.raises(ValueError, match="not staged for"):
        publish_directory(tmp_path / "b", staged)
    assert not (tmp_path / "b").exists()
