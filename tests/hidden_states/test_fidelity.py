"""The fidelity checks without Dagster: a correct store passes, and each silent failure fails, naming where and why.

The corpus is the tiny target's own greedy continuations of random prompts (as in the demo, where the simulator
answers with the tiny target), so the target run in full predicts almost every response token: a store that
does not is wrong. Bad stores are made the way real bugs make them: through the real extraction loop and store
writer, with a capture that is off by one position, takes a wrong or repeated layer, or runs another model.
"""

import random
import shutil
from pathlib import Path

import pytest
import torch

from eagle_assets.draft.target import load_target_head
from eagle_assets.hidden_states.calibration import calibrate_store
from eagle_assets.hidden_states.extract_hf import HFFeatureExtractor
from eagle_assets.hidden_states.fidelity import FidelityConfig, read_calibration, write_calibration
from eagle_assets.hidden_states.fidelity_checks import (
    ALIGNMENT,
    AUX_LAYERS,
    NEXT_TOKEN,
    CorpusShard,
    run_fidelity_checks,
)
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.pipeline import run_extraction
from eagle_assets.hidden_states.store import HiddenStateSample, StoreMeta
from eagle_assets.target.tiny import build_tiny_target, load_target, tiny_model_id
from tests.draft.helpers import batch_greedy

KEY = "train-00007"
LAYERS = AuxLayers.default(7)  # HF indices (2, 3, 4) of the 7-layer tiny target
STORE_DTYPE = torch.bfloat16
CONFIG = FidelityConfig(positions=96, calibration_samples=3)


@pytest.fixture(scope="module")
def corpus(tiny_model) -> CorpusShard:
    """Eight samples: a random prompt and a prefix of the target's greedy continuation (one batched generate)."""
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(1000, 150_000, (8, 10), generator=gen)
    full = batch_greedy(tiny_model, prompts, 16)
    r = random.Random(3)
    samples = []
    for i, row in enumerate(full.tolist()):
        ids = row[: 10 + r.randint(8, 16)]
        samples.append(HiddenStateSample(f"p{i}", ids, [0] * 10 + [1] * (len(ids) - 10)))
    return CorpusShard(KEY, samples, [10] * len(samples))


@pytest.fixture(scope="module")
def calibration(tiny_model, corpus):
    """The target (seed 0) run in full on the calibration samples: what every store below is held to."""
    return calibrate_store(
        tiny_model,
        [(corpus.key, corpus.samples)],
        LAYERS,
        model_id=tiny_model_id(0),
        store_dtype=STORE_DTYPE,
        config=CONFIG,
    )


@pytest.fixture(scope="module")
def head(tiny_dir):
    return load_target_head(tiny_dir)


def write_store(directory: Path, corpus: CorpusShard, compute, calibration, layers: AuxLayers = LAYERS) -> Path:
    meta = StoreMeta(model_id=tiny_model_id(0), hidden_size=64, layers=layers, dtype=STORE_DTYPE)
    run_extraction({corpus.key: corpus.samples}, directory, meta, compute, max_tokens_per_batch=64)
    write_calibration(directory, calibration)
    return directory


def checks(store: Path, corpus: CorpusShard, head) -> dict[str, object]:
    outcomes = run_fidelity_checks(store, [corpus], head, partition=KEY, config=CONFIG)
    return {o.name: o for o in outcomes}


def assert_fails(outcome, *phrases: str) -> None:
    """Failed, and the summary names the partition, the shard, the check and the figure."""
    assert not outcome.passed, outcome.summary
    assert outcome.summary.startswith(f"hidden_states {KEY} shard-00000: {outcome.name} FAILED: "), outcome.summary
    for phrase in phrases:
        assert phrase in outcome.summary, outcome.summary


class Shifted:
    """A capture off by one position: the features of token t-1 stored at t (a classic off-by-one)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, batch):
        return [{k: torch.cat([v[:1], v[:-1]]) for k, v in f.items()} for f in self.inner(batch)]


class RepeatedLow:
    """The low layer stored twice: mid is a copy of low."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, batch):
        out = []
        for f in self.inner(batch):
            aux = f["aux"].clone()
            aux[:, 64:128] = aux[:, :64]
            out.append({**f, "aux": aux})
        return out


@pytest.fixture(scope="module")
def good_store(tmp_path_factory, tiny_model, corpus, calibration):
    extractor = HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE)
    return write_store(tmp_path_factory.mktemp("good"), corpus, extractor, calibration)


def test_a_correct_store_passes_with_its_figures_recorded(good_store, corpus, calibration, head):
    cal = calibration.shards["shard-00000"]
    assert cal.target.n > 40 and cal.target.agreement > 0.9  # the tiny target predicts its own greedy answers
    assert set(cal.signatures) == {*map(str, range(7)), "last"}
    result = checks(good_store, corpus, head)
    for outcome in result.values():
        assert outcome.passed, outcome.summary
    nt = result[NEXT_TOKEN].metadata
    assert nt["agreement"] >= 0.9 * nt["target_agreement"] and nt["consistency"] >= 0.9
    assert abs(nt["mean_logprob"] - nt["target_mean_logprob"]) < 0.05  # bf16 rounding only
    assert nt["shard_positions"] == 96  # spread over the whole shard, beyond the calibration samples
    aux = result[AUX_LAYERS].metadata
    assert aux["nearest_layers"] == {"low": "2", "mid": "3", "high": "4", "last": "last"}
    assert aux["non_finite"] == {"aux": 0, "last": 0} and aux["finite_scan"].startswith("all ")
    assert set(aux["norms"]) == {"low", "mid", "high", "last"} and aux["norms"]["last"] > 0
    assert result[ALIGNMENT].metadata["samples"] == 8
    # the calibration file round-trips
    assert read_calibration(good_store).shards["shard-00000"] == cal


def test_a_one_position_shift_fails(tmp_path, tiny_model, corpus, calibration, head):
    shifted = Shifted(HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE))
    result = checks(write_store(tmp_path / "s", corpus, shifted, calibration), corpus, head)
    assert_fails(result[NEXT_TOKEN], "top-1 agreement", "the target run in full on 3 calibration samples")
    assert_fails(result[AUX_LAYERS], "slot low claims layer 2 but matches no layer of the target")
    assert result[ALIGNMENT].passed  # ids and masks are right: only the features moved


def test_a_wrong_layer_fails_and_names_the_layer_it_is(tmp_path, tiny_model, corpus, calibration, head):
    # captured at (2, 3, 5), recorded as (2, 3, 4)
    wrong = HFFeatureExtractor(tiny_model, AuxLayers((2, 3, 5), 7), out_dtype=STORE_DTYPE)
    result = checks(write_store(tmp_path / "w", corpus, wrong, calibration), corpus, head)
    assert_fails(result[AUX_LAYERS], "slot high claims layer 4 but is nearest to layer 5")
    assert result[NEXT_TOKEN].passed and result[ALIGNMENT].passed


def test_a_duplicated_layer_fails(tmp_path, tiny_model, corpus, calibration, head):
    repeated = RepeatedLow(HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE))
    result = checks(write_store(tmp_path / "d", corpus, repeated, calibration), corpus, head)
    assert_fails(
        result[AUX_LAYERS], "slot mid claims layer 3 but is nearest to layer 2", "slots low~mid differ by 0.0000"
    )


def test_another_models_states_fail(tmp_path_factory, tmp_path, corpus, calibration, head):
    other = load_target(build_tiny_target(tmp_path_factory.mktemp("seed1") / "tiny", seed=1))
    foreign = HFFeatureExtractor(other, LAYERS, out_dtype=STORE_DTYPE)  # recorded as the seed-0 target's
    result = checks(write_store(tmp_path / "o", corpus, foreign, calibration), corpus, head)
    assert_fails(result[NEXT_TOKEN], "top-1 agreement", "top-1 consistency with the target")
    assert_fails(result[AUX_LAYERS], "slot low claims layer 2 but matches no layer of the target")


def test_a_truncated_shard_fails(tmp_path, good_store, corpus, head):
    store = tmp_path / "t"
    shutil.copytree(good_store, store)
    shard = store / "shard-00000.safetensors"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 1000)
    result = checks(store, corpus, head)
    assert_fails(result[ALIGNMENT], f"shard-00000.safetensors is truncated: {size - 1000:,} bytes on disk")
    assert f"its header describes {size:,}" in result[ALIGNMENT].summary
    assert_fails(result[NEXT_TOKEN], "cannot read the shard")
    assert_fails(result[AUX_LAYERS], "cannot read the shard")


def test_a_store_of_other_inputs_or_without_calibration_fails(tmp_path, good_store, corpus, head):
    store = tmp_path / "nocal"
    shutil.copytree(good_store, store)
    (store / "fidelity_calibration.json").unlink()
    result = checks(store, corpus, head)
    assert_fails(result[NEXT_TOKEN], "no calibration recorded for shard-00000")
    assert result[ALIGNMENT].passed
    changed = CorpusShard(
        KEY, [*corpus.samples[:-1], HiddenStateSample("p7", [1, 2, 3], [0, 1, 1])], corpus.prompt_lens
    )
    result = checks(good_store, changed, head)
    assert_fails(result[ALIGNMENT], "other inputs than the corpus shard now holds", "1 of 8 samples with")


def test_a_pre_norm_store_is_checked_through_the_final_norm(tmp_path, tiny_model, tiny_dir, corpus):
    calibration = calibrate_store(
        tiny_model,
        [(corpus.key, corpus.samples)],
        LAYERS,
        model_id=tiny_model_id(0),
        store_dtype=STORE_DTYPE,
        last_kind="pre_norm",
        config=CONFIG,
    )
    meta = StoreMeta(model_id=tiny_model_id(0), hidden_size=64, layers=LAYERS, dtype=STORE_DTYPE, last_kind="pre_norm")
    extractor = HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE, last_kind="pre_norm")
    run_extraction({corpus.key: corpus.samples}, tmp_path / "pre", meta, extractor)
    write_calibration(tmp_path / "pre", calibration)
    outcomes = run_fidelity_checks(
        tmp_path / "pre", [corpus], load_target_head(tiny_dir, "pre_norm"), partition=KEY, config=CONFIG
    )
    for o in outcomes:
        assert o.passed, o.summary
    assert {o.name: o for o in outcomes}[NEXT_TOKEN].metadata["agreement"] > 0.9
