from sensors.training import decide_training


def test_waits_until_every_shard_is_there():
    d = decide_training(["train-00000", "train-00001"], {"train-00000": 5}, None)
    assert not d.run and "1 of 2" in d.reason and "train-00001" in d.reason
    assert not decide_training([], {}, None).run


def test_trains_when_data_is_newer_than_the_last_draft_and_keys_follow_the_data():
    needed = ["train-00000", "train-00001"]
    first = decide_training(needed, {"train-00000": 5, "train-00001": 7}, None)
    assert first.run and first.run_key.startswith("draft-")
    assert not decide_training(needed, {"train-00000": 5, "train-00001": 7}, 9).run  # draft after both
    again = decide_training(needed, {"train-00000": 5, "train-00001": 12}, 9)  # one shard refreshed
    assert again.run and again.run_key != first.run_key
    assert decide_training(needed, {"train-00000": 5, "train-00001": 12}, None).run_key == again.run_key
