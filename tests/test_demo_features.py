"""The demo's ``--features``: offline by default (the store and its checks), online skips the store."""

import argparse

import pytest

from eagle_assets import demo


class RecordingDemo:
    instance = None
    last_result = None

    def __init__(self):
        self.materialized = []

    def materialize(self, keys, label, partition=None, config=None):
        self.materialized.append(label)
        return True


def test_online_makes_no_store_and_offline_is_the_default(capsys, monkeypatch):
    recorder = RecordingDemo()
    demo.extract_hidden_states(recorder, "online")
    assert recorder.materialized == []
    assert "no store (--features online" in capsys.readouterr().out

    monkeypatch.setattr("eagle_assets.shard_partitions.train_partitions", lambda instance: ["train-00000"])
    demo.extract_hidden_states(recorder, "offline")
    assert recorder.materialized == ["hidden_states/train-00000"]


def test_the_flag_defaults_to_offline(monkeypatch):
    seen = []
    parse = argparse.ArgumentParser.parse_args

    def spy(self, args=None, namespace=None):
        seen.append(parse(self, args, namespace).features)
        raise SystemExit(0)  # stop before the demo starts anything

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    for argv in ([], ["--features", "online"]):
        with pytest.raises(SystemExit):
            demo.main(argv)
    assert seen == ["offline", "online"]
