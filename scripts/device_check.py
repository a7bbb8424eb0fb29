#!/usr/bin/env python3
"""The pipeline's GPU path, end to end without Dagster, on one device: ``python3 scripts/device_check.py --out DIR``.

Why it exists: everything the ``gpu`` pool runs (hidden-state extraction in padded bf16 batches, the calibration
and the three fidelity checks, EAGLE-3 training under bf16 autocast, the in-process speculative benchmark) is tested
on CPU fp32 only. A GPU changes the numbers the fidelity checks are held to (bf16 compute, padded batches, other
kernels), so the question this script answers on a GPU host is whether a *correct* store passes them there, with the
default ``fidelity_deviation_factor``, and whether the rest of the path trains and decodes.

It calls the same pure functions the assets call (``extract_hf``, ``calibrate_store``, ``run_fidelity_checks``,
``train_cli.run``, ``evaluate_acceptance``), with the glue of ``assets/hidden_states.py`` (``calibrate_partition``,
``check_partition``), ``assets/draft.py`` (``train_run_config``) and ``assets/draft_benchmark.py``
(``run_inprocess``) repeated here, so that it needs neither Dagster, polars, DuckDB nor the tokenizer (tiktoken).
Third-party imports: torch, transformers, safetensors, numpy and pydantic (the trainer's ``TrainConfig``); the JSON
lists every third-party module that was actually loaded.

The data: random prompts continued greedily by the tiny target itself in float32 (as the simulator writes the demo's
responses), so that its next-token agreement is meaningful; the tiny target is built with its full output
vocabulary (``text_safe_output=False``: restricting it needs the tokenizer), ``--safe-output`` builds the demo's.

Writes ``device_check.json`` and ``device_check.log`` under ``--out``; exits 1 naming every failed check. Beside it:
``device_check_report.py`` (the checks, the log, the stages' timing) and ``device_check_corpus.py`` (stages 1 and
2, the tiny target and its corpus), imported from this folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its helpers, also as scripts.device_check

STARTED = time.monotonic()  # before torch: its import is part of what a GPU host pays
import torch  # noqa: E402
from device_check_corpus import (  # noqa: E402
    SIZES,
    Corpus,
    Sizes,
    build_target,
    check_greedy_paths,
    greedy_no_cache,
    make_corpus,
)
from device_check_report import Check, Report, environment, third_party_modules  # noqa: E402

PARTITION = "train-00000"
EAGLE_STEPS = 4  # the in-process benchmark's draft tokens per verification (TINY_TARGET_BENCHMARK_CONFIG)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------
# 1. The tiny target and 2. the corpus: scripts/device_check_corpus.py
# 3. Hidden states, calibration, fidelity checks (hidden_states asset, HF backend)


def extract(model: Any, corpus: Corpus, out: Path, max_tokens_per_batch: int, model_id: str) -> Any:
    from eagle_assets.hidden_states.extract_hf import extract_hf

    return extract_hf(
        model,
        {PARTITION: corpus.samples},
        out,
        model_id=model_id,
        layers=None,
        dtype=torch.bfloat16,  # the target resource's default store_dtype
        max_tokens_per_batch=max_tokens_per_batch,
        reserve_bytes=0,
    )


def calibrate(model: Any, corpus: Corpus, store_dir: Path, model_id: str) -> None:
    """``assets/hidden_states.calibrate_partition``: the target run in full on the shard's calibration samples."""
    from eagle_assets.hidden_states.calibration import calibrate_store
    from eagle_assets.hidden_states.fidelity import write_calibration
    from eagle_assets.hidden_states.fidelity_spec import FidelityConfig
    from eagle_assets.hidden_states.samples import as_sample
    from eagle_assets.hidden_states.store import HiddenStateStore

    store = HiddenStateStore(store_dir)
    calibration = calibrate_store(
        model,
        [(PARTITION, [as_sample(s) for s in corpus.samples])],
        store.layers,
        model_id=model_id,
        store_dtype=store.meta.dtype,
        last_kind=store.meta.last_kind,
        config=FidelityConfig(),
    )
    write_calibration(store_dir, calibration)


def fidelity(corpus: Corpus, store_dir: Path, model_dir: Path, device: torch.device) -> list[Any]:
    """``assets/hidden_states.check_partition``: the three checks with the target's head as training loads it."""
    from eagle_assets.draft.target import load_target_head
    from eagle_assets.hidden_states.fidelity_checks import CorpusShard, run_fidelity_checks
    from eagle_assets.hidden_states.fidelity_spec import FidelityConfig
    from eagle_assets.hidden_states.samples import as_sample
    from eagle_assets.hidden_states.store import HiddenStateStore

    head = load_target_head(model_dir, HiddenStateStore(store_dir).meta.last_kind).to(device)
    shard = CorpusShard(PARTITION, [as_sample(s) for s in corpus.samples], corpus.prompt_lens)
    return run_fidelity_checks(store_dir, [shard], head, partition=PARTITION, device=device, config=FidelityConfig())


def next_token_figures(outcome: Any) -> dict[str, Any]:
    from eagle_assets.hidden_states.fidelity_spec import FidelityConfig

    m = dict(outcome.metadata)
    factor = FidelityConfig().deviation_factor
    dev, noise = m.get("logprob_deviation"), m.get("logprob_noise")
    ratio = dev / noise if isinstance(dev, float) and isinstance(noise, float) and noise > 0 else None
    keys = ("agreement", "target_agreement", "consistency", "dtype_consistency", "mean_logprob", "target_mean_logprob")
    figures = {k: m.get(k) for k in (*keys, "shard_agreement", "shard_mean_logprob", "calibration_positions")}
    return {**figures, "logprob_deviation": dev, "noise_floor": noise, "ratio": ratio, "deviation_factor": factor}


def report_fidelity(report: Report, outcomes: list[Any], label: str, counts: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for o in outcomes:
        extra = next_token_figures(o) if o.name == "last_state_next_token" else {}
        report.check(Check(f"{label}:{o.name}", o.passed, o.summary, extra, counts=counts))
        figures[o.name] = {"passed": o.passed, **extra}
        if extra:
            r = extra["ratio"]
            report.log(
                f"    {label} next token: agreement {extra['agreement']} (target {extra['target_agreement']}), "
                f"log-prob deviation {extra['logprob_deviation']} vs noise floor {extra['noise_floor']}: ratio "
                f"{'n/a' if r is None else f'{r:.2f}'} (allowed {extra['deviation_factor']:g})"
            )
    return figures


def compare_stores(a: Path, b: Path) -> dict[str, float]:
    """How far the padded-batch last states are from the one-sample-per-batch ones (same model, same dtype)."""
    from eagle_assets.hidden_states.store import HiddenStateStore

    sa, sb = HiddenStateStore(a), HiddenStateStore(b)
    worst, total, n = 0.0, 0.0, 0
    for i in range(len(sa)):
        x, y = sa[i]["last"].float(), sb[i]["last"].float()
        rel = ((x - y).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-12)).tolist()
        worst, total, n = max(worst, *rel), total + sum(rel), n + len(rel)
    return {"max_relative_l2": round(worst, 6), "mean_relative_l2": round(total / max(n, 1), 6)}


def hidden_states_stage(
    report: Report,
    summary: dict[str, Any],
    fp32: Any,
    corpus: Corpus,
    model_dir: Path,
    padded: Path,
    single: Path,
    device: torch.device,
    compute_dtype: torch.dtype,
    model_id: str,
) -> None:
    """The ``hidden_states`` stage: the store in padded batches, calibrated, its three checks; then, as a diagnostic,
    the same store one sample per batch against the same calibration. Figures go to ``summary["hidden_states"]``."""
    model = load(model_dir, device, compute_dtype) if compute_dtype != torch.float32 else fp32
    rep = extract(model, corpus, padded, 16384, model_id)  # the target resource's default batch
    sync(device)
    report.log(f"    padded batches: {rep.tokens_computed} tokens in {rep.seconds:.2f}s ({rep.tokens_per_s:.0f}/s)")
    t0 = time.monotonic()
    calibrate(model, corpus, padded, model_id)
    sync(device)
    calibration_s = time.monotonic() - t0
    t0 = time.monotonic()
    outcomes = fidelity(corpus, padded, model_dir, device)
    summary["hidden_states"] = {
        "tokens_per_s": round(rep.tokens_per_s, 1),
        "extract_seconds": round(rep.seconds, 2),
        "calibration_seconds": round(calibration_s, 2),
        "checks_seconds": round(time.monotonic() - t0, 2),
        "padded": report_fidelity(report, outcomes, "padded", counts=True),
    }
    # Diagnostic: the same store one sample per batch (no padding), against the same calibration.
    extract(model, corpus, single, 1, model_id)
    shutil.copy2(padded / "fidelity_calibration.json", single / "fidelity_calibration.json")
    outcomes = fidelity(corpus, single, model_dir, device)
    summary["hidden_states"]["one_sample_per_batch"] = report_fidelity(report, outcomes, "unpadded", counts=False)
    summary["hidden_states"]["padded_vs_unpadded_last"] = compare_stores(padded, single)
    report.log(f"    padded vs unpadded last states: {summary['hidden_states']['padded_vs_unpadded_last']}")


# ----------------------------------------------------------------------------------------------
# 4. Draft training (draft_model asset) and acceptance length (draft_benchmark, in process)


def run_config(model_dir: Path, store_root: Path, layers: list[int], out: Path, sizes: Sizes) -> Any:
    """``assets/draft.train_run_config`` with ``TINY_TARGET_TRAIN_CONFIG``'s knobs and a fixed step count."""
    from eagle_assets.draft.run_config import (
        DraftRunConfig,
        EmbeddingsSpec,
        ExportSpec,
        StoreData,
        TargetSpec,
        TrainConfig,
        VocabSpec,
    )
    from eagle_assets.target.tiny import KIMI_EOS_ID

    return DraftRunConfig(
        seed=0,
        target=TargetSpec(path=str(model_dir), last_kind="post_norm"),
        draft_vocab_size=sizes.draft_vocab,
        aux_layer_ids=layers,
        embeddings=EmbeddingsSpec(kind="target"),
        vocab=VocabSpec(kind="from_data", force_ids=[KIMI_EOS_ID]),
        data=StoreData(
            kind="store",
            path=str(store_root),
            reader="eagle_assets.hidden_states.store_set:StoreSet",
            reader_kwargs={"partitions": [PARTITION]},
            max_length=512,
        ),
        train=TrainConfig(
            lr=5e-3,
            epochs=1,
            max_steps=sizes.train_steps,
            warmup_ratio=0.05,
            batch_size=8,
            ttt_steps=7,
            checkpoint_every=0,
        ),
        output_dir=str(out),
        export=ExportSpec(dtype="bfloat16"),
        log_every=max(1, sizes.train_steps // 10),
    )


def train(cfg: Any, device: torch.device) -> list[Any]:
    from eagle_assets.draft.train_cli import run

    steps: list[Any] = []
    run(cfg, device=device, on_step=steps.append)
    sync(device)
    return steps


def online_training(
    report: Report, cfg: Any, corpus: Corpus, work: Path, device: torch.device, offline: list[Any]
) -> dict[str, Any]:
    """``draft_model`` with ``features: online``: the same run from token rows, the target computing each batch's
    features through the extraction's function (prefetched, the fidelity checks on the first rows); its losses
    against the offline run's, and the bytes it wrote (none: no store)."""
    from eagle_assets.draft.run_config import TokensData
    from eagle_assets.draft.train_cli import run

    rows = work / "online-rows.jsonl"
    rows.write_text("".join(json.dumps({k: s[k] for k in ("input_ids", "loss_mask")}) + "\n" for s in corpus.samples))
    data = {"kind": "tokens", "path": str(rows), "max_length": 512, "feature_dtype": "bfloat16"}
    dtype = "bfloat16" if device.type == "cuda" else "float32"  # as the hidden_states asset loads the target
    online_cfg = cfg.model_copy(
        update={
            "data": TokensData.model_validate(data),
            "target": cfg.target.model_copy(update={"dtype": dtype}),
            "output_dir": str(work / "draft-run-online"),
        }
    )
    steps: list[Any] = []
    t0 = time.monotonic()
    trainer = run(online_cfg, device=device, on_step=steps.append)
    sync(device)
    assert trainer.stream is not None  # tokens data: the online stream
    stats = trainer.stream.stats
    n = min(50, len(steps), len(offline))
    diffs = [abs(a.loss - b.loss) / max(abs(b.loss), 1e-9) for a, b in zip(steps[:n], offline[:n], strict=True)]
    written = sum(
        p.stat().st_size for p in (work / "draft-run-online").rglob("*.safetensors") if "export" not in p.parts
    )
    figures = {
        "steps": len(steps),
        "seconds": round(time.monotonic() - t0, 2),
        "max_rel_loss_diff_first_50": max(diffs),
        "target_tokens_per_s": round(stats.tokens_per_s, 1),
        "waited_for_target_s": round(stats.waited_s, 2),
        "fidelity": stats.extra.get("fidelity", {}),
        "feature_bytes_written": written,
    }
    report.check(
        Check(
            "online_training_matches_offline",
            max(diffs) <= 1e-2 and written == 0,
            f"first {n} losses within {max(diffs):.2e} (relative) of offline's, target {stats.tokens_per_s:.0f} "
            f"tokens/s, {written} feature bytes written; fidelity on the stream: passed",
            figures,
        )
    )
    return figures


def report_training(report: Report, steps: list[Any]) -> dict[str, Any]:
    losses = [s.loss for s in steps]
    w = max(1, min(10, len(losses) // 4))
    first, last = sum(losses[:w]) / w, sum(losses[-w:]) / w
    settled = steps[min(5, len(steps) - 1) :]  # past the first steps' allocations and kernel selection
    seconds = sum(s.seconds for s in settled)
    tokens_per_s = sum(s.tokens for s in settled) / seconds if seconds > 0 else 0.0
    every = max(1, len(losses) // 20)
    figures = {
        "steps": len(steps),
        "loss_first": round(first, 4),
        "loss_last": round(last, 4),
        "window": w,
        "loss_trajectory": [[s.step, round(s.loss, 4)] for s in steps[::every]] + [[steps[-1].step, losses[-1]]],
        "tokens_per_s": round(tokens_per_s, 1),
        "sim_tau_last": round(steps[-1].sim_tau, 3),
        "acc_last": [round(a, 3) for a in steps[-1].acc],
    }
    report.log(f"    loss by step: {figures['loss_trajectory']}")
    report.check(
        Check(
            "draft_loss_decreases",
            last < 0.9 * first and all(math.isfinite(x) for x in losses),
            f"mean loss of the last {w} steps {last:.4f} vs the first {w} {first:.4f} (must be < 0.9 ×, finite); "
            f"{tokens_per_s:.0f} tokens/s after step 5; simulated τ {steps[-1].sim_tau:.3f}",
            figures,
        )
    )
    return figures


def acceptance(model: Any, export: Path, prompts: list[list[int]], sizes: Sizes, device: torch.device) -> dict:
    """``draft_benchmark.run_inprocess``: the trained draft and an untrained one through the speculative loop."""
    from eagle_assets.draft.export import load_draft
    from eagle_assets.draft.model import Eagle3Draft
    from eagle_assets.draft.speculative import evaluate_acceptance
    from resources.serving.acceptance import AcceptanceTally

    embed = model.get_input_embeddings().weight.detach().float()
    trained = load_draft(export, embed_weight=embed, device=device)
    torch.manual_seed(0)
    untrained = Eagle3Draft(trained.config, embed.cpu()).to(device)
    untrained.set_vocab(trained.vocab)
    out: dict[str, Any] = {}
    for name, draft in (("trained", trained), ("untrained", untrained)):
        t0 = time.monotonic()
        stats = evaluate_acceptance(model, draft, prompts, sizes.max_new_tokens, num_draft_tokens=EAGLE_STEPS)
        sync(device)
        tally = AcceptanceTally.from_rounds(stats.accepted, EAGLE_STEPS, stats.new_tokens)
        out[name] = {
            "tau": round(tally.tau or 0.0, 4),
            "per_position": [round(r, 4) for r in tally.position_rates or []],
            "new_tokens": stats.new_tokens,
            "verifications": len(stats.accepted),
            "seconds": round(time.monotonic() - t0, 2),
        }
    out["draft"] = trained
    return out


def vocab_coverage(draft: Any, corpus: Corpus) -> float:
    """Share of the training responses' tokens the draft vocabulary holds: the most a draft token can be right."""
    t2d = draft.vocab.t2d.cpu()
    ids = torch.tensor([t for s in corpus.samples for t, m in zip(s["input_ids"], s["loss_mask"], strict=True) if m])
    return round(float(t2d[ids].double().mean()), 4)


def check_speculative_output(model: Any, draft: Any, corpus: Corpus, report: Report) -> None:
    """The speculative loop must emit the target's greedy decode (what τ is worth only if true)."""
    from eagle_assets.draft.speculative import speculative_generate

    n, agree = 16, []
    for prompt in corpus.eval_prompts[:2]:
        ref = greedy_no_cache(model, prompt, n)
        got = speculative_generate(model, draft, prompt, n, num_draft_tokens=EAGLE_STEPS).tokens
        agree.append(next((i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), min(len(got), n)))
    report.check(
        Check(
            "speculative_equals_greedy",
            all(a == n for a in agree),
            f"first {n} tokens of the speculative loop equal to the greedy decode on 2 prompts: {agree}",
        )
    )


# ----------------------------------------------------------------------------------------------


def load(model_dir: Path, device: torch.device, dtype: torch.dtype) -> Any:
    from eagle_assets.target.loader import load_target

    return load_target(model_dir, device, dtype)


def run_all(args: argparse.Namespace, report: Report, work: Path) -> dict[str, Any]:
    device = torch.device(args.device)
    sizes = SIZES[device.type]
    if args.train_steps:
        sizes = Sizes(**{**sizes.__dict__, "train_steps": args.train_steps})
    if args.samples:
        sizes = Sizes(**{**sizes.__dict__, "train_samples": args.samples})
    compute_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # as the hidden_states asset loads it
    summary: dict[str, Any] = {"sizes": sizes.__dict__, "compute_dtype": str(compute_dtype).removeprefix("torch.")}
    report.log(f"environment: {environment(device)}")
    summary["environment"] = environment(device)

    with report.stage("cuda_init" if device.type == "cuda" else "device_init") as st:
        torch.zeros(1, device=device).add_(1)
        sync(device)
    with report.stage("build_target") as st:
        model_dir = build_target(work, args.safe_output, args.target)
        fp32 = load(model_dir, device, torch.float32)  # the data's source and the benchmark's target, as in the demo
    if not st.ok:
        return summary
    from eagle_assets.target.tiny_targets import tiny_target_model_id

    model_id = tiny_target_model_id(args.target, 0)
    summary["target"] = {"name": args.target, "safe_output": args.safe_output, "path": "built in a temporary folder"}
    with report.stage("corpus") as st:
        corpus = make_corpus(fp32, sizes, device)
        sync(device)
        n_tokens = sum(len(s["input_ids"]) for s in corpus.samples)
        summary["corpus"] = {"samples": len(corpus.samples), "tokens": n_tokens, "eval": len(corpus.eval_prompts)}
        report.log(f"    {len(corpus.samples)} samples, {n_tokens} tokens; {len(corpus.eval_prompts)} held-out prompts")
        check_greedy_paths(fp32, corpus, report)
    if not st.ok:
        return summary

    store_root = work / "hidden_states"
    padded, single = store_root / PARTITION, work / "hidden_states_single" / PARTITION
    with report.stage("hidden_states") as st:
        hidden_states_stage(report, summary, fp32, corpus, model_dir, padded, single, device, compute_dtype, model_id)
    if not st.ok:
        return summary

    from eagle_assets.hidden_states.store import HiddenStateStore

    layers = list(HiddenStateStore(padded).layers.hf_indices)
    with report.stage("draft_model") as st:
        cfg = run_config(model_dir, store_root, layers, work / "draft-run", sizes)
        steps = train(cfg, device)
        summary["draft_model"] = report_training(report, steps)
    if not st.ok:
        return summary
    with report.stage("draft_model_online"):
        summary["draft_model_online"] = online_training(report, cfg, corpus, work, device, steps)
    tau: float | None = None  # the in-process τ, printed beside vLLM's (None when its stage failed)
    with report.stage("draft_benchmark") as st:
        result = acceptance(fp32, work / "draft-run" / "export", corpus.eval_prompts, sizes, device)
        trained = result.pop("draft")
        result["draft_vocab_coverage"] = vocab_coverage(trained, corpus)
        summary["draft_benchmark"] = {**result, "num_steps": EAGLE_STEPS, "max_new_tokens": sizes.max_new_tokens}
        tau, base = result["trained"]["tau"], result["untrained"]["tau"]
        report.check(
            Check(
                "acceptance_length",
                tau > base,
                f"τ {tau:.3f} trained vs {base:.3f} untrained ({len(corpus.eval_prompts)} held-out prompts, "
                f"{EAGLE_STEPS} draft tokens, {sizes.max_new_tokens} new tokens); per position "
                f"{result['trained']['per_position']}; draft vocabulary holds {result['draft_vocab_coverage']:.1%} "
                "of the training responses' tokens",
                result,
            )
        )
        check_speculative_output(fp32, trained, corpus, report)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # EAGLE_FORGE_VLLM_PACKAGE=vllm==0.32.0 bash scripts/setup.sh
        report.log("vllm: not installed, its stages skipped")
    elif args.target.startswith("kimi"):
        vllm_kimi_text_stage(report, summary, work)
    else:
        vllm_stages(report, summary, model_dir, work, corpus.eval_prompts, sizes.max_new_tokens, tau)
    return summary


def vllm_kimi_text_stage(report: Report, summary: dict[str, Any], work: Path) -> None:
    """vLLM's route on Kimi K2.5's architecture. The whole tiny Kimi does not load in vLLM: its ``kimi_k25`` loader
    wants the release's checkpoint names and image processor (docs/hidden-states.md). Its text model
    (``DeepseekV3ForCausalLM``, MLA at the release's 512 + 64 latent) does: its features against the HF backend's.
    No served draft: on CPU vLLM's MLA and the draft's attention share no KV-cache block size."""
    from eagle_assets.hidden_states.extract_vllm import parity_check
    from eagle_assets.target.tiny_kimi import build_tiny_kimi_text_target

    with report.stage("vllm_hidden_states_mla"):
        text = build_tiny_kimi_text_target(work / "kimi-text")
        summary["vllm_parity_mla"] = parity_check(text, work_dir=work / "vllm-parity-mla")
        report.check(parity_verdict("vllm_features_mla", summary["vllm_parity_mla"]))


def parity_verdict(name: str, parity: dict[str, float]) -> Check:
    """vLLM's features against the HF backend's: fp32 on CPU agrees to ~1e-7 (1e-5 allowed); a GPU engine runs in
    the checkpoint's bf16, ~1e-2 (5e-2 allowed)."""
    bound = 5e-2 if torch.cuda.is_available() else 1e-5
    worst = max(parity.values())
    return Check(
        name, worst < bound, f"vLLM vs HF features, max relative difference {parity} (bound {bound:g})", parity
    )


def vllm_stages(
    report: Report, summary: dict[str, Any], model_dir: Path, work: Path, prompts: Any, new: int, tau: float | None
) -> None:
    """The real engine's route: its features against the HF backend's, then the trained export served by it."""
    from eagle_assets.hidden_states.extract_vllm import parity_check
    from resources.serving.vllm_engine import served_tally

    with report.stage("vllm_hidden_states"):
        summary["vllm_parity"] = parity_check(model_dir, work_dir=work / "vllm-parity")
        report.check(parity_verdict("vllm_features", summary["vllm_parity"]))
    with report.stage("vllm_draft_benchmark"):
        # As the draft_benchmark asset serves it: an engine sized for these prompts (a CPU one with its settings).
        ids = [list(map(int, p)) for p in prompts]
        export = str(work / "draft-run" / "export")
        served = served_tally(str(model_dir), export, ids, new, EAGLE_STEPS, on_cuda=torch.cuda.is_available())
        summary["vllm_draft_benchmark"] = {"tau": served.tau, "per_position": served.position_rates}
        beside = "" if tau is None else f" beside {tau:.3f} in process"
        report.log(f"    τ through vLLM {served.tau if served.tau is None else round(served.tau, 3)}{beside}")


def check_target(args: argparse.Namespace, out: Path) -> bool:
    """The whole path on ``args.target``; writes ``device_check.json``/``.log`` under ``out``; True when all passed."""
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out)
    work = args.work / args.target if args.work else Path(tempfile.mkdtemp(prefix="device_check-"))
    work.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    try:
        summary = run_all(args, report, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
        wall = time.monotonic() - report.started
        failed = report.failed
        if not report.checks:
            failed = ["nothing was checked"]
        doc = {
            "passed": not failed,
            "failed": failed,
            "wall_seconds": round(wall, 1),
            "import_seconds": round(report.started - STARTED, 1),
            "stage_seconds": report.stages,
            "checks": [c.__dict__ for c in report.checks],
            **summary,
            "third_party_modules": third_party_modules(),
        }
        (out / "device_check.json").write_text(json.dumps(doc, indent=2, default=str))
        report.log(f"third-party modules loaded: {', '.join(doc['third_party_modules'])}")
        report.log(f"wall time {wall:.1f}s; " + ("ALL PASSED" if not failed else f"FAILED: {', '.join(failed)}"))
        report.file.close()
    return not failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="device_check.json and device_check.log go here")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--train-steps", type=int, default=0, help="0: 300 on CUDA, 40 on CPU")
    parser.add_argument("--samples", type=int, default=0, help="training samples; 0: 256 on CUDA, 48 on CPU")
    parser.add_argument("--safe-output", action="store_true", help="the demo's target (needs tiktoken)")
    parser.add_argument("--work", type=Path, default=None, help="keep the target, stores and draft here")
    parser.add_argument(
        "--targets",
        nargs="+",
        choices=["llama-tiny", "kimi-k25-tiny"],
        default=["llama-tiny", "kimi-k25-tiny"],
        help="the tiny targets to check, in turn: the Llama's results in --out, each other's in --out/<name>",
    )
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    passed = True
    for name in args.targets:
        args.target = name
        passed = check_target(args, args.out if name == "llama-tiny" else args.out / name) and passed
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
