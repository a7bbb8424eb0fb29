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


def test_waits_for_the_fidelity_checks_and_says_which_failed():
    needed = ["train-00000", "train-00001"]
    latest = {"train-00000": 5, "train-00001": 7}
    why = "last_state_next_token FAILED: top-1 agreement 0.0000 < 0.9000 (0.9 × 1.0000, …)"
    d = decide_training(needed, latest, None, {"train-00001": why})
    assert not d.run and "fidelity checks of 1 of 2 shards" in d.reason and f"train-00001: {why}" in d.reason
    assert decide_training(needed, latest, None, {}).run  # every check passed
    assert decide_training(needed, latest, None, {"train-00009": why}).run  # a shard training does not use


def test_online_needs_only_the_corpus_and_keys_follow_it():
    from sensors.training import decide_online_training

    needed = ["train-00000", "train-00001"]
    assert not decide_online_training(needed, None, None).run  # no corpus yet
    first = decide_online_training(needed, 40, None)  # no hidden states asked for
    assert first.run and first.run_key.startswith("draft-") and "online" in first.reason
    assert not decide_online_training(needed, 40, 55).run  # the draft is newer than the corpus
    again = decide_online_training(needed, 60, 55)
    assert again.run and again.run_key != first.run_key
