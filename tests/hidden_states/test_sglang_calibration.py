"""Calibration through the SGLang engine: the engine's input log-probabilities stand for the target run in full.

The stand-in engine (``sglang_standin.py``) answers in SGLang's shapes with the real tiny target's numbers, so a
store extracted and calibrated through it is held to the same figures as the HF backend's, and a capture that
returns the wrong state is caught, at calibration or by the next-token check.
"""

import random

import pytest
import torch

from eagle_assets.draft.target import load_target_head
from eagle_assets.hidden_states.calibration import calibrate_store
from eagle_assets.hidden_states.calibration_sglang import (
    CalibrationMismatchError,
    CalibrationResponseError,
    build_calibration_request,
    scored_by_engine,
)
from eagle_assets.hidden_states.capture_draft import write_capture_draft
from eagle_assets.hidden_states.extract_sglang import SGLangCaptureConfig, SGLangEngineClient, extract_sglang
from eagle_assets.hidden_states.fidelity import FidelityConfig, read_calibration, write_calibration
from eagle_assets.hidden_states.fidelity_checks import (
    ALIGNMENT,
    AUX_LAYERS,
    NEXT_TOKEN,
    CorpusShard,
    run_fidelity_checks,
)
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.target.tiny import tiny_model_id
from tests.draft.helpers import batch_greedy
from tests.hidden_states.sglang_standin import FakeSGLangEngine

KEY = "train-00003"
LAYERS = AuxLayers.default(7)
CONFIG = FidelityConfig(positions=96, calibration_samples=3)
STORE_DTYPE = torch.bfloat16


@pytest.fixture(scope="module")
def shard(tiny_model) -> CorpusShard:
    """Random prompts and the tiny target's greedy answers (what the simulator serves in the demo)."""
    prompts = torch.randint(1000, 150_000, (6, 10), generator=torch.Generator().manual_seed(5))
    full = batch_greedy(tiny_model, prompts, 14)
    r = random.Random(5)
    samples = []
    for i, row in enumerate(full.tolist()):
        ids = row[: 10 + r.randint(8, 14)]
        samples.append(HiddenStateSample(f"q{i}", ids, [0] * 10 + [1] * (len(ids) - 10)))
    return CorpusShard(KEY, samples, [10] * len(samples))


@pytest.fixture(scope="module")
def head(tiny_dir):
    return load_target_head(tiny_dir)


@pytest.fixture
def capture(tmp_path, tiny_dir) -> SGLangCaptureConfig:
    draft = write_capture_draft(tmp_path / "capture-draft", tiny_dir, LAYERS)
    return SGLangCaptureConfig(
        model_path=str(tiny_dir), layers=LAYERS, draft_path=str(draft), max_tokens_per_batch=64, dtype="float32"
    )


def engines(model, started: list, last_layer: int | None = None):
    def factory(cfg, role, hidden):
        engine = FakeSGLangEngine(model, cfg.engine_kwargs(role), last_layer=last_layer if role == "last" else None)
        started.append((role, engine))
        return SGLangEngineClient(cfg, role, hidden_size=hidden, engine=engine, out_dtype=STORE_DTYPE)

    return factory


def extract(out, shard, capture, model, head, started, last_layer=None, calibration=CONFIG):
    return extract_sglang(
        {shard.key: shard.samples},
        out,
        capture,
        model_id=tiny_model_id(0),
        dtype=STORE_DTYPE,
        client_factory=engines(model, started, last_layer),
        calibration=calibration,
        head=head,
        check_space=False,
    )


def checks(store, shard, head, config=CONFIG):
    return {o.name: o for o in run_fidelity_checks(store, [shard], head, partition=KEY, config=config)}


def test_the_request_and_the_answer_in_sglangs_shape(tiny_model, shard):
    req = build_calibration_request(shard.samples[:2])
    assert req["return_logprob"] is True and req["logprob_start_len"] == 0 and req["top_logprobs_num"] == 1
    assert req["sampling_params"]["temperature"] == 1.0 and req["return_hidden_states"] is True
    engine = FakeSGLangEngine(tiny_model, {"enable_return_hidden_states": True, "disable_radix_cache": True})
    answer = engine.generate(**req)[0]
    sample = shard.samples[0]
    top1, logprob = scored_by_engine(answer, sample, [9, 10])
    with torch.inference_mode():
        lsm = torch.log_softmax(tiny_model(torch.tensor([sample.input_ids])).logits[0], -1)
    assert top1 == [int(lsm[9].argmax()), int(lsm[10].argmax())]
    assert logprob == pytest.approx([float(lsm[9, sample.input_ids[10]]), float(lsm[10, sample.input_ids[11]])])
    shifted = {"meta_info": {**answer["meta_info"]}}
    shifted["meta_info"]["input_token_logprobs"] = [*answer["meta_info"]["input_token_logprobs"][1:], (0.0, 1, None)]
    with pytest.raises(CalibrationResponseError, match="pads it with None"):
        scored_by_engine(shifted, sample, [9])
    with pytest.raises(CalibrationResponseError, match="return_logprob=true, logprob_start_len=0"):
        scored_by_engine({"meta_info": {"hidden_states": []}}, sample, [9])


def test_an_sglang_store_is_calibrated_through_the_engine_and_passes(tmp_path, tiny_model, shard, capture, head):
    started: list = []
    extract(tmp_path / "s", shard, capture, tiny_model, head, started)
    cal = read_calibration(tmp_path / "s")
    assert cal is not None
    rec = cal.shards["shard-00000"]
    assert rec.source == "sglang" and set(rec.signatures) == {"last"} and rec.logprob_noise > 0
    assert [e.logprob_requests for _, e in started] == [0, 1]  # one scoring request, on the last pass's engine
    # the same figures as the HF calibration: the target run in full, positions and all
    hf = calibrate_store(
        tiny_model, [(KEY, shard.samples)], LAYERS, model_id="x", store_dtype=STORE_DTYPE, config=CONFIG
    ).shards["shard-00000"]
    assert rec.positions == hf.positions and rec.next_ids == hf.next_ids and rec.target_top1 == hf.target_top1
    assert rec.target_logprob == pytest.approx(hf.target_logprob, abs=1e-4)

    result = checks(tmp_path / "s", shard, head)
    assert result[NEXT_TOKEN].passed and result[ALIGNMENT].passed, result[NEXT_TOKEN].summary
    assert result[NEXT_TOKEN].metadata["calibration_source"] == "sglang"
    # which layer each aux slot holds cannot be told from the engine: not a silent pass
    assert not result[AUX_LAYERS].passed
    assert "no per-layer reference, so which layer each slot holds is not verified" in result[AUX_LAYERS].summary
    opted = FidelityConfig(positions=96, calibration_samples=3, allow_unreferenced_aux=True)
    aux = checks(tmp_path / "s", shard, head, opted)[AUX_LAYERS]
    assert aux.passed and "identity NOT verified (allow_unreferenced_aux" in aux.summary
    assert aux.metadata["layer_identity"].startswith("not verified") and aux.metadata["allow_unreferenced_aux"]

    started.clear()  # a rerun with nothing left to do keeps the calibration and asks the engines nothing
    extract(tmp_path / "s", shard, capture, tiny_model, head, started)
    assert [e.prompts for _, e in started] == [0, 0]


def test_an_engine_returning_another_layer_as_last_is_refused_at_calibration(
    tmp_path, tiny_model, shard, capture, head
):
    with pytest.raises(CalibrationMismatchError, match="returns a state other than the one its head reads"):
        extract(tmp_path / "w", shard, capture, tiny_model, head, [], last_layer=6)
    assert read_calibration(tmp_path / "w") is None


def test_a_wrong_layer_sglang_store_fails_the_next_token_check(tmp_path, tiny_model, shard, capture, head):
    # the store from a misconfigured last pass (layer N-1 as last), the calibration from a correct engine
    extract(tmp_path / "good", shard, capture, tiny_model, head, [])
    extract(tmp_path / "bad", shard, capture, tiny_model, head, [], last_layer=6, calibration=None)
    write_calibration(tmp_path / "bad", read_calibration(tmp_path / "good"))
    result = checks(tmp_path / "bad", shard, head)
    outcome = result[NEXT_TOKEN]
    assert not outcome.passed
    assert outcome.summary.startswith(f"hidden_states {KEY} shard-00000: {NEXT_TOKEN} FAILED: "), outcome.summary
    assert "log-prob deviation from the target, mean over positions," in outcome.summary
    assert "what half an ulp of bfloat16 moves them" in outcome.summary
