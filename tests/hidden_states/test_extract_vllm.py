"""The vLLM backend against the real vLLM engine (the CPU build): the stores it writes are the HF backend's, at
tensor-parallel sizes 1 and 2, with the engine calibration and the three fidelity checks passing on them.

Each engine start costs 8–15 s here (its core in this process; 28–34 s with a core process of its own), so the two
engines are module fixtures, shared by every test below; the last test kills the tp=2 one.
``EAGLE_FORGE_REQUIRE_VLLM=1`` (set by ``.ci/run``) turns the skip where vLLM is missing into a failure.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

from eagle_assets.hidden_states.extract_hf import extract_hf
from eagle_assets.hidden_states.extract_vllm import VLLMEngineConfig, VLLMFeatureClient, extract_vllm
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.store import HiddenStateStore
from tests.hidden_states.conftest import assert_same_store, make_corpus, relative
from tests.vllm_engines import require_vllm

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
require_vllm()


def engine_config(tiny_dir, scratch, tp_size: int) -> VLLMEngineConfig:
    layers = AuxLayers.default(7)
    return VLLMEngineConfig(
        model_path=str(tiny_dir),
        layers=layers,
        tp_size=tp_size,
        max_seq_len=512,
        max_tokens_per_batch=1024,
        dtype="float32",
        scratch_dir=str(scratch),
    )


@pytest.fixture(scope="module")
def clients(tiny_dir, tmp_path_factory):
    """One engine per tensor-parallel size, started once for the module (fp32, so the comparison is exact)."""
    made = {}
    try:
        for tp in (1, 2):
            scratch = tmp_path_factory.mktemp(f"handoff-tp{tp}")
            made[tp] = VLLMFeatureClient(engine_config(tiny_dir, scratch, tp), out_dtype=torch.float32)
            made[tp].engine  # noqa: B018 - start it now, not inside the first test's timing
        yield made
    finally:
        for c in made.values():
            c.close()


@pytest.fixture(scope="module")
def hf_store(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-store")
    extract_hf(
        str(tiny_dir),
        make_corpus(seed=3),
        out,
        model_id="tiny",
        dtype=torch.float32,
        last_kind="pre_norm",
        device="cpu",
        check_space=False,
    )
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_store_equals_the_hf_store(tp, clients, hf_store, tiny_dir, tmp_path):
    client = clients[tp]
    report = extract_vllm(
        make_corpus(seed=3),
        tmp_path / "vllm",
        client.config,
        model_id="tiny",
        dtype=torch.float32,
        client=client,
        check_space=False,
    )
    assert report.shards_computed == 4 and report.tokens_computed > 0
    assert_same_store(tmp_path / "vllm", hf_store)
    index = json.loads((tmp_path / "vllm" / "index.json").read_text())
    assert index["last_kind"] == "pre_norm" and index["layers"]["hf_indices"] == [2, 3, 4]
    assert index["extra"] == {"backend": "vllm", "tp_size": tp, "vllm_layer_ids": [2, 3, 4, 7]}


def test_tp2_features_equal_tp1(clients, tiny_dir):
    samples = make_corpus(seed=5, n_shards=1, per_shard=(4, 4))[0]
    one, two = clients[1](samples), clients[2](samples)
    for a, b in zip(one, two, strict=True):
        assert relative(b["aux"], a["aux"]) < 1e-5 and relative(b["last"], a["last"]) < 1e-5


def test_resume_computes_only_what_is_missing(clients, tmp_path):
    client = clients[1]
    corpus = make_corpus(seed=7)
    first = extract_vllm(
        corpus[:2], tmp_path / "s", client.config, dtype=torch.float32, client=client, check_space=False
    )
    again = extract_vllm(corpus, tmp_path / "s", client.config, dtype=torch.float32, client=client, check_space=False)
    assert (first.shards_computed, again.shards_skipped, again.shards_computed) == (2, 2, 2)


def test_engine_calibration_passes_the_three_checks(clients, tiny_dir, tmp_path):
    """The calibration through the engine's own prompt log-probabilities (what a target too large for this process
    gets), then the three blocking checks on the store: pass, with the aux identity reported as not verified."""
    from eagle_assets.draft.target import load_target_head
    from eagle_assets.hidden_states.calibration_engine import calibrate_shard_engine
    from eagle_assets.hidden_states.fidelity import Calibration, FidelityConfig, calibrate_shards, write_calibration
    from eagle_assets.hidden_states.fidelity_checks import CorpusShard, run_fidelity_checks
    from eagle_assets.hidden_states.samples import HiddenStateSample

    client = clients[1]
    raw = make_corpus(seed=11, n_shards=2, per_shard=(4, 5), length=(20, 40))
    # a prompt (a third of each row) and its response, as the corpus gives them
    corpus = [
        [HiddenStateSample(s.sample_id, s.input_ids, [0] * (len(s) // 3) + [1] * (len(s) - len(s) // 3)) for s in shard]
        for shard in raw
    ]
    out = tmp_path / "store"
    extract_vllm(corpus, out, client.config, dtype=torch.float32, client=client, check_space=False)
    config = FidelityConfig(allow_unreferenced_aux=True)
    head = load_target_head(tiny_dir, "pre_norm")

    def calibrator(head):
        return functools.partial(
            calibrate_shard_engine,
            client.score,
            client.config.layers,
            head,
            hidden_size=64,
            store_dtype=torch.float32,
            compute_dtype=torch.float32,
            config=config,
        )

    one = calibrator(head)
    records = calibrate_shards([(str(i), s) for i, s in enumerate(corpus)], one)
    assert {r.source for r in records.values()} == {"vllm"}
    write_calibration(out, Calibration("tiny", "float32", "pre_norm", config, records))
    shards = [CorpusShard(str(i), s, [len(x) // 3 for x in s]) for i, s in enumerate(corpus)]
    outcomes = run_fidelity_checks(out, shards, head, partition="p", device="cpu", config=config)
    assert len(outcomes) == 3 and all(o.passed for o in outcomes), [o.summary for o in outcomes]
    # The same state through the post-norm head is not what the engine scored: refused, nothing written.
    from eagle_assets.hidden_states.calibration_engine import CalibrationMismatchError

    wrong = calibrator(load_target_head(tiny_dir, "post_norm"))
    with pytest.raises(CalibrationMismatchError):
        calibrate_shards([("0", corpus[0])], wrong)


def test_online_training_through_the_engine_equals_offline_from_its_store(clients, tiny_dir, tiny_model, tmp_path):
    """Online: the trainer takes each batch's features from the engine; offline: from the store the same engine
    wrote. Same seed, rows and order: the same losses."""
    from eagle_assets.draft.train_cli import build, run
    from eagle_assets.hidden_states.online_features import online_stream
    from tests.hidden_states.online_runs import greedy_corpus, offline_data, online_data, run_config, write_rows

    client = clients[1]
    corpus = greedy_corpus(tiny_model, 8)
    rows = write_rows(tmp_path / "rows.jsonl", corpus)
    store = tmp_path / "hidden_states" / "train-00000"
    extract_vllm({"train-00000": corpus}, store, client.config, dtype=torch.bfloat16, client=client, check_space=False)
    offline: list[float] = []
    run(
        run_config(tiny_dir, offline_data(store), tmp_path / "offline", steps=6),
        on_step=lambda m: offline.append(m.loss),
    )

    def shared_engine_stream(spec, **kw):
        return online_stream(spec, **kw, engine=client.engine)

    global _STREAM
    _STREAM = shared_engine_stream
    data = online_data(
        rows,
        backend="vllm",
        stream=f"{__name__}:_shared_stream",
        vllm={"dtype": "float32", "max_seq_len": 512, "max_tokens_per_batch": 1024},
        fidelity_config={"allow_unreferenced_aux": True},  # the engine has no per-layer reference
    )
    cfg = run_config(tiny_dir, data, tmp_path / "online", steps=6)
    cfg["target"]["last_kind"] = "pre_norm"
    online: list[float] = []
    trainer = build(cfg, torch.device("cpu"), on_step=lambda m: online.append(m.loss))
    trainer.train()
    assert trainer.stream.stats.extra["fidelity"]["last_state_next_token"].startswith("hidden_states online")
    assert len(online) == len(offline) == 6
    torch.testing.assert_close(torch.tensor(online), torch.tensor(offline), rtol=1e-5, atol=1e-6)
    assert not list((tmp_path / "online").rglob("*.safetensors*"))  # no features kept on disk


_STREAM = None


def _shared_stream(spec, **kw):
    """What ``train_cli`` resolves by name: the online stream over this module's shared engine."""
    assert _STREAM is not None
    return _STREAM(spec, **kw)


def test_a_killed_tp_worker_fails_the_extraction_and_keeps_only_whole_shards(clients, tmp_path):
    """SIGKILL of a tensor-parallel worker once the first shard is committed: the next batch fails with
    ``VLLMEngineDiedError`` (not a hang), and the store holds the committed shard only, which a rerun skips.
    Last in the module: it kills the tp=2 engine the tests above share."""
    import os
    import signal

    from eagle_assets.hidden_states.extract_vllm import VLLMEngineDiedError

    client = clients[2]
    core = client.engine.llm_engine.engine_core  # vLLM's in-process core client
    workers = core.engine_core.model_executor.workers
    killed: list[int] = []

    def kill_after_first_shard(p):
        if p.event == "shard" and not killed:
            killed.append(workers[-1].proc.pid)
            os.kill(killed[0], signal.SIGKILL)

    corpus = make_corpus(seed=13)
    with pytest.raises(VLLMEngineDiedError, match="died mid-batch"):
        extract_vllm(
            corpus,
            tmp_path / "s",
            client.config,
            dtype=torch.float32,
            client=client,
            progress=kill_after_first_shard,
            check_space=False,
        )
    assert killed and client.engine_died() is False  # the client let the dead engine go
    # ... shut down at once, not by its finalizer whenever the collector gets to it: that shutdown tears down the
    # process's tensor-parallel groups, and it once ran in the middle of the next module's engine start
    assert not core._finalizer.alive
    store = HiddenStateStore(tmp_path / "s")
    assert len(store) == len(corpus[0])  # the committed shard, whole; nothing of the one in progress
    assert not list((tmp_path / "s").rglob("*.tmp-*"))  # no half-written shard left behind
