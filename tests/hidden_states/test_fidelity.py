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
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.store_format import StoreMeta
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


def assert_every_slot_named_wrong(aux) -> None:
    """Failed, naming every slot as not what it claims; which of the two wordings each gets depends on the corpus."""
    assert_fails(aux)
    for slot, layer in (("low", 2), ("mid", 3), ("high", 4)):
        wrong = (f"slot {slot} claims layer {layer} but matches no layer", f"slot {slot} is ", "not that layer's")
        assert wrong[0] in aux.summary or (wrong[1] in aux.summary and wrong[2] in aux.summary), aux.summary


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
    assert_every_slot_named_wrong(result[AUX_LAYERS])
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
    assert_every_slot_named_wrong(result[AUX_LAYERS])


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


class LastFrom:
    """The last state taken from the wrong place: ``pick(features, sample)`` gives what is stored as "last"."""

    def __init__(self, inner, pick):
        self.inner, self.pick = inner, pick

    def __call__(self, batch):
        return [{**f, "last": self.pick(f, s)} for f, s in zip(self.inner(batch), batch, strict=True)]


def layer_input(model, j: int):
    """HF hidden_states[j] of a sample: the input of decoder layer j (j = N-1: one layer short of the end)."""

    @torch.inference_mode()
    def pick(_features, sample):
        out = model(torch.tensor([list(sample.input_ids)]), output_hidden_states=True)
        return out.hidden_states[j][0].to(STORE_DTYPE)

    return pick


def test_a_last_state_one_layer_short_fails_the_next_token_check(tmp_path, tiny_model, corpus, calibration, head):
    # "capturing layer 60 instead of the true final state": the input of the last decoder layer, stored as last.
    # It keeps 98% of the top-1s and the mean log-prob; each position's log-prob moves ~20x the noise floor.
    short = LastFrom(HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE), layer_input(tiny_model, 6))
    result = checks(write_store(tmp_path / "n1", corpus, short, calibration), corpus, head)
    assert_fails(result[NEXT_TOKEN], "log-prob deviation from the target, mean over positions,", "what half an ulp")
    assert result[NEXT_TOKEN].metadata["logprob_deviation"] > 4 * result[NEXT_TOKEN].metadata["logprob_noise"]


def test_the_high_aux_layer_stored_as_last_fails_the_next_token_check(tmp_path, tiny_model, corpus, calibration, head):
    high = LastFrom(HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE), lambda f, _s: f["aux"][:, 128:])
    result = checks(write_store(tmp_path / "hi", corpus, high, calibration), corpus, head)
    # agreement 0.91 with n = 44 positions: below 1 - 3 standard errors of 44 positions
    assert_fails(result[NEXT_TOKEN], "top-1 agreement 0.9091 <", "3 standard errors of 44 positions")
    assert "top-1 consistency with the target 0.9091 <" in result[NEXT_TOKEN].summary
    assert "log-prob deviation from the target" in result[NEXT_TOKEN].summary


def test_a_pre_norm_state_labelled_post_norm_fails_the_next_token_check(
    tmp_path, tiny_model, corpus, calibration, head
):
    # the tiny target's final norm has unit weights: the argmax survives, the log-probs do not
    pre = HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE, last_kind="pre_norm")
    result = checks(write_store(tmp_path / "pre", corpus, pre, calibration), corpus, head)
    assert result[NEXT_TOKEN].metadata["agreement"] == 1.0
    assert_fails(result[NEXT_TOKEN], "log-prob deviation from the target, mean over positions,")


def test_a_correct_store_batched_otherwise_passes_with_room(tmp_path, tiny_model, corpus, calibration, head):
    """Thresholds come from the calibration sample, not from this store: one sample per batch (no padding) passes
    with the deviation well inside its bound."""
    store = tmp_path / "b1"
    meta = StoreMeta(model_id=tiny_model_id(0), hidden_size=64, layers=LAYERS, dtype=STORE_DTYPE)
    extractor = HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE)
    run_extraction({corpus.key: corpus.samples}, store, meta, extractor, max_tokens_per_batch=1)
    write_calibration(store, calibration)
    result = checks(store, corpus, head)
    for outcome in result.values():
        assert outcome.passed, outcome.summary
    nt = result[NEXT_TOKEN].metadata
    assert nt["logprob_deviation"] < 2 * nt["logprob_noise"]  # the bound is 4x: a factor 2 of room at least


class NaNInAux:
    def __init__(self, inner):
        self.inner = inner

    def __call__(self, batch):
        out = []
        for f in self.inner(batch):
            aux = f["aux"].clone()
            aux[-1, 5] = float("nan")
            aux[0, 70] = float("inf")
            out.append({**f, "aux": aux})
        return out


class SwapLowHigh:
    def __init__(self, inner):
        self.inner = inner

    def __call__(self, batch):
        out = []
        for f in self.inner(batch):
            a = f["aux"]
            out.append({**f, "aux": torch.cat([a[:, 128:192], a[:, 64:128], a[:, :64]], 1)})
        return out


def test_nan_or_inf_in_the_aux_states_fails(tmp_path, tiny_model, corpus, calibration, head):
    bad = NaNInAux(HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE))
    result = checks(write_store(tmp_path / "nan", corpus, bad, calibration), corpus, head)
    assert_fails(result[AUX_LAYERS], "16 NaN/inf values in aux (all ")  # 2 per sample, 8 samples
    assert result[AUX_LAYERS].metadata["non_finite"] == {"aux": 16, "last": 0}


def test_swapped_low_and_high_layers_fail(tmp_path, tiny_model, corpus, calibration, head):
    swapped = SwapLowHigh(HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE))
    result = checks(write_store(tmp_path / "sw", corpus, swapped, calibration), corpus, head)
    assert_fails(
        result[AUX_LAYERS],
        "slot low claims layer 2 but is nearest to layer 4",
        "slot high claims layer 4 but is nearest to layer 2",
    )
    assert result[AUX_LAYERS].metadata["nearest_layers"] == {"low": "4", "mid": "3", "high": "2", "last": "last"}


def test_a_loss_mask_covering_a_prompt_token_fails(tmp_path, tiny_model, corpus, head):
    # the store and the corpus agree with each other, but the mask also covers the last prompt token
    samples = [
        HiddenStateSample(s.sample_id, s.input_ids, [0] * 9 + [1] * (len(s.input_ids) - 9)) for s in corpus.samples
    ]
    bad = CorpusShard(KEY, samples, corpus.prompt_lens)
    cal = calibrate_store(
        tiny_model, [(KEY, samples)], LAYERS, model_id=tiny_model_id(0), store_dtype=STORE_DTYPE, config=CONFIG
    )
    result = checks(
        write_store(tmp_path / "m", bad, HFFeatureExtractor(tiny_model, LAYERS, out_dtype=STORE_DTYPE), cal), bad, head
    )
    n0 = len(samples[0].input_ids)
    assert_fails(
        result[ALIGNMENT],
        "8 of 8 samples with loss mask not exactly the response",
        f"p0: mask covers {n0 - 9} tokens, the response is {n0 - 10} (prompt_len 10)",
    )


def test_a_feature_of_the_wrong_shape_fails(tmp_path, good_store, corpus, head):
    from safetensors import safe_open
    from safetensors.torch import save_file

    store = tmp_path / "shape"
    shutil.copytree(good_store, store)
    path = store / "shard-00000.safetensors"
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
        metadata = f.metadata()
    tensors["aux"] = tensors["aux"][:, :128].contiguous()  # two layers' worth of columns
    save_file(tensors, str(path), metadata=metadata)
    result = checks(store, corpus, head)
    t = sum(len(s.input_ids) for s in corpus.samples)
    assert_fails(result[ALIGNMENT], f"aux has shape [{t}, 128], the sample offsets need [{t}, 192]")
    assert_fails(result[AUX_LAYERS], f"aux has shape [{t}, 128], expected [{t}, 192] = [tokens, 3 × 64]")
