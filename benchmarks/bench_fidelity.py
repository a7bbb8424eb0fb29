"""What the hidden-state fidelity checks cost, against the extraction they guard (both measured in this run).

On the tiny Kimi-vocabulary target (CPU): one corpus shard shaped like the demo's (160 samples, prompts of 40-120
tokens, responses of 60-200), extracted with ``extract_hf`` (bf16 store), then the calibration (the target run in
full on ``calibration_samples`` samples) and the three checks (``run_fidelity_checks``). Printed: seconds of each,
the checks' share of the extraction's time, and how many bytes of the store the checks read, which is what
carries over to Kimi K2.5: the checks read a fixed number of rows (positions × features), not the shard.

    python benchmarks/bench_fidelity.py              # ~40k tokens, 3 repeats
    python benchmarks/bench_fidelity.py --quick      # ~8k tokens, one repeat
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from eagle_assets.draft.target import load_target_head  # noqa: E402
from eagle_assets.hidden_states.calibration import calibrate_store  # noqa: E402
from eagle_assets.hidden_states.extract_hf import extract_hf  # noqa: E402
from eagle_assets.hidden_states.fidelity import write_calibration  # noqa: E402
from eagle_assets.hidden_states.fidelity_checks import CorpusShard, run_fidelity_checks  # noqa: E402
from eagle_assets.hidden_states.fidelity_spec import FidelityConfig  # noqa: E402
from eagle_assets.hidden_states.layers import AuxLayers  # noqa: E402
from eagle_assets.hidden_states.samples import HiddenStateSample  # noqa: E402
from eagle_assets.target.tiny import build_tiny_target, load_target, tiny_model_id  # noqa: E402

KIMI_HIDDEN, KIMI_SHARD_TOKENS = 7168, 2000 * 3000  # a 2,000-sample Kimi K2.5 shard of ~3k tokens per sample


def corpus(n: int, seed: int = 0) -> CorpusShard:
    r = random.Random(seed)
    samples, prompt_lens = [], []
    for i in range(n):
        p, c = r.randint(40, 120), r.randint(60, 200)
        ids = [r.randrange(1000, 150_000) for _ in range(p + c)]
        samples.append(HiddenStateSample(f"b{i}", ids, [0] * p + [1] * c))
        prompt_lens.append(p)
    return CorpusShard("train-00000", samples, prompt_lens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, repeats = (30, 1) if args.quick else (160, 3)
    config = FidelityConfig()
    work = Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    try:
        target = build_tiny_target(work / "tiny", seed=0)
        model = load_target(target)
        head = load_target_head(target)
        shard = corpus(n)
        tokens = sum(len(s) for s in shard.samples)
        layers = AuxLayers.default(7)
        times: dict[str, list[float]] = {"extraction": [], "calibration": [], "checks": []}
        for k in range(repeats):
            store = work / f"store-{k}"
            t0 = time.perf_counter()
            extract_hf(model, {shard.key: shard.samples}, store, model_id=tiny_model_id(0), dtype=torch.bfloat16)
            t1 = time.perf_counter()
            cal = calibrate_store(
                model, [(shard.key, shard.samples)], layers, model_id=tiny_model_id(0), store_dtype=torch.bfloat16
            )
            write_calibration(store, cal)
            t2 = time.perf_counter()
            outcomes = run_fidelity_checks(store, [shard], head, partition=shard.key, config=config)
            t3 = time.perf_counter()
            assert all(o.passed for o in outcomes), [o.summary for o in outcomes if not o.passed]
            for name, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                times[name].append(dt)
            store_bytes = sum(p.stat().st_size for p in store.glob("*.safetensors"))
            shutil.rmtree(store)
        med = {name: statistics.median(v) for name, v in times.items()}
        print(f"tiny target, one shard of {n} samples, {tokens:,} tokens, bf16 store of {store_bytes / 2**20:.1f} MiB")
        print(f"median of {repeats}: " + ", ".join(f"{name} {t:.2f} s" for name, t in med.items()))
        print(
            f"checks = {med['checks'] / med['extraction']:.2f}× the extraction's time; "
            f"calibration + checks = {(med['calibration'] + med['checks']) / med['extraction']:.2f}×"
        )
        # What the checks read: the paired and the spread positions' rows (aux + last), once for the finite scan
        # too when the shard is small (here: every row, which is why the tiny shard reads it whole).
        rows = 2 * config.positions
        row_bytes = (3 + 1) * KIMI_HIDDEN * 2
        kimi_shard = KIMI_SHARD_TOKENS * row_bytes
        head_flop = 2 * rows * KIMI_HIDDEN * 163_840
        read = rows * row_bytes
        print(
            f"Kimi K2.5 projection (not measured): a shard of {KIMI_SHARD_TOKENS:,} tokens is "
            f"{kimi_shard / 1e9:.0f} GB; the checks read {rows} rows = {read / 2**20:.0f} MiB of it "
            f"({read / kimi_shard:.1e} of the shard; the NaN scan samples rows above "
            f"{config.full_scan_bytes >> 30} GiB) and the head costs {head_flop / 1e12:.2f} TFLOP "
            "(milliseconds on one H200, tens of seconds on 2 CPU cores)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
