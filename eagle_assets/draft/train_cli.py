"""``python -m eagle_assets.draft.train_cli --config run.json`` — one process or under ``torchrun``.

    torchrun --standalone --nproc_per_node=8 -m eagle_assets.draft.train_cli --config run.json

The config (JSON, or YAML by suffix) names everything a run needs, so the same file reproduces it::

    {
      "seed": 0,                                   # draft init
      "model": {...Eagle3Config fields...},        # or omit and give target.path + draft_vocab_size
      "draft_vocab_size": 32000,
      "aux_layer_ids": [2, 30, 58],                # HF output_hidden_states indices (with target.path)
      "target": {"path": "/models/kimi", "last_kind": "post_norm"},
      "embeddings": {"kind": "target" | "synthetic" | "random", "seed": 1},   # not the target's: exported
      "vocab": {"kind": "from_data" | "identity" | "file", "path": "...", "force_ids": [163586]},
      "data": {"kind": "store", "path": "/data/hs", "reader": "module:Class", "max_length": 4096}
            | {"kind": "tokens", "path": "rows.jsonl"}          # online: the target computes features
            | {"kind": "synthetic", "n_samples": 64, "length": [12, 24], "seed": 0},
      "train": {...TrainConfig fields...},
      "output_dir": "runs/x",                      # checkpoints/, metrics.jsonl, export/
      "export": {"dtype": "bfloat16"},             # one folder for SGLang and vLLM (see export.py)
      "log_every": 10
    }

The store reader is resolved by name at run time (default
``eagle_assets.hidden_states.store:HiddenStateStore``) so that this module depends only on its
``__len__``/``__getitem__`` contract. A run resumes from ``output_dir/checkpoints`` when a checkpoint
is there.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from eagle_assets.draft import distributed as du
from eagle_assets.draft.data import RowDataset, StoreDataset, SyntheticDataset, TokenDataset
from eagle_assets.draft.export import export_draft
from eagle_assets.draft.model import Eagle3Config, Eagle3Draft
from eagle_assets.draft.target import HFTargetFeatures, hf_target_head, load_target_embeddings, load_target_head
from eagle_assets.draft.train import StepMetrics, TrainConfig, Trainer
from eagle_assets.draft.vocab import DraftVocab, vocab_from_samples

DEFAULT_READER = "eagle_assets.hidden_states.store:HiddenStateStore"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load_config(path: str | Path) -> dict[str, Any]:
    text = Path(path).read_text()
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        return dict(yaml.safe_load(text))
    return dict(json.loads(text))


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _load_hf_target(path: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return model.to(device).eval().requires_grad_(False)


def _model_config(cfg: Mapping[str, Any]) -> Eagle3Config:
    if "model" in cfg:
        return Eagle3Config.from_dict(cfg["model"])
    target = cfg.get("target", {}).get("path")
    if not target:
        raise ValueError("give either 'model' or 'target.path' (+ 'draft_vocab_size')")
    from transformers import AutoConfig

    ids = cfg.get("aux_layer_ids")
    return Eagle3Config.from_target(
        AutoConfig.from_pretrained(target, local_files_only=True),
        int(cfg["draft_vocab_size"]),
        tuple(ids) if ids else None,
    )


def _vocab(spec: Mapping[str, Any], dataset: RowDataset, config: Eagle3Config) -> DraftVocab:
    kind = spec.get("kind", "from_data")
    if kind == "identity":
        return DraftVocab.identity(config.draft_vocab_size, config.target_vocab_size)
    if kind == "file":
        path = Path(spec["path"])
        if path.is_dir():  # an export folder
            from safetensors.torch import load_file

            d2t = load_file(str(path / "model.safetensors"))["d2t"]
        else:
            d2t = torch.load(path, map_location="cpu", weights_only=True)["d2t"]
        return DraftVocab.from_d2t(d2t, config.target_vocab_size)
    if kind == "from_data":
        rows = (dataset[i] for i in range(len(dataset)))
        return vocab_from_samples(rows, config.target_vocab_size, config.draft_vocab_size, spec.get("force_ids", ()))
    raise ValueError(f"unknown vocab kind {kind!r}")


def build(
    cfg: Mapping[str, Any],
    device: torch.device | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
) -> Trainer:
    """Everything from the config, in a fixed order so that every rank builds the same run."""
    device = device or (
        torch.device("cuda", du.current().local_rank) if torch.cuda.is_available() else torch.device("cpu")
    )
    config = _model_config(cfg)
    data = cfg["data"]
    target = cfg.get("target", {})
    train_cfg = dict(cfg.get("train", {}))
    out = Path(cfg["output_dir"]) if cfg.get("output_dir") else None
    if out is not None and not train_cfg.get("checkpoint_dir"):
        train_cfg["checkpoint_dir"] = str(out / "checkpoints")
    tc = TrainConfig.from_dict(train_cfg)

    features = None
    dataset: RowDataset
    embed: torch.Tensor | None = None  # the target's embedding matrix, when the data source has it at hand
    if data["kind"] == "synthetic":
        synth = SyntheticDataset(
            int(data.get("n_samples", 64)),
            hidden_size=config.target_hidden_size,
            vocab_size=config.target_vocab_size,
            n_aux=len(config.aux_layer_ids),
            length=tuple(data.get("length", (12, 24))),  # type: ignore[arg-type]
            seed=int(data.get("seed", 0)),
        )
        dataset, head, embed = synth, synth.target_head(), synth.embed_weight
    elif data["kind"] == "store":
        store = _resolve(data.get("reader", DEFAULT_READER))(data["path"], **data.get("reader_kwargs", {}))
        dataset = StoreDataset(store, max_length=data.get("max_length"))
        head = load_target_head(target["path"], target.get("last_kind", "post_norm"))
    elif data["kind"] == "tokens":
        rows = [json.loads(line) for line in Path(data["path"]).read_text().splitlines() if line.strip()]
        dataset = TokenDataset(rows, max_length=data.get("max_length"))
        model = _load_hf_target(target["path"], _DTYPES[target.get("dtype", "bfloat16")], device)
        features = HFTargetFeatures(model, config.aux_layer_ids)
        head, embed = hf_target_head(model), model.get_input_embeddings().weight.detach().float().cpu()
    else:
        raise ValueError(f"unknown data kind {data['kind']!r}")

    kind = cfg.get("embeddings", {}).get("kind") or ("synthetic" if data["kind"] == "synthetic" else "target")
    if kind == "random":
        gen = torch.Generator().manual_seed(int(cfg["embeddings"].get("seed", 0)))
        embed = torch.randn(config.target_vocab_size, config.hidden_size, generator=gen)
    elif kind == "target" and embed is None:
        embed = load_target_embeddings(target["path"])
    elif kind == "synthetic" and data["kind"] != "synthetic":
        raise ValueError("synthetic embeddings need synthetic data")
    if embed is None:
        raise ValueError(f"unknown embeddings kind {kind!r}")
    if kind != "target" and not config.save_embeddings:
        # Not the target's matrix: an export without it would be served with the target's, silently.
        config = replace(config, save_embeddings=True)

    torch.manual_seed(int(cfg.get("seed", 0)))
    draft = Eagle3Draft(config, embed.float())
    draft.set_vocab(_vocab(cfg.get("vocab", {}), dataset, config))
    log_every = int(cfg.get("log_every", 1))
    metrics_file = out / "metrics.jsonl" if out is not None else None

    def callback(m: StepMetrics) -> None:
        if metrics_file is not None:
            with metrics_file.open("a") as f:
                f.write(json.dumps(asdict(m)) + "\n")
        if log_every and (m.step % log_every == 0 or m.step == 1):
            acc = " ".join(f"{a:.3f}" for a in m.acc)
            print(
                f"step {m.step} epoch {m.epoch} loss {m.loss:.4f} acc [{acc}] sim_tau {m.sim_tau:.3f} "
                f"lr {m.lr:.2e} gnorm {m.grad_norm:.3f} tok/s {m.tokens_per_s:.0f}",
                flush=True,
            )
        if on_step is not None:
            on_step(m)

    if out is not None and du.current().is_main:
        out.mkdir(parents=True, exist_ok=True)
    if hasattr(head, "to"):
        head = head.to(device)
    return Trainer(draft, dataset, head, tc, features=features, callback=callback, device=device)


def run(
    cfg: Mapping[str, Any],
    device: torch.device | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
) -> Trainer:
    trainer = build(cfg, device, on_step)
    if trainer.resume() and trainer.dist.is_main:
        print(f"resumed at step {trainer.global_step} (epoch {trainer.epoch}, batch {trainer.batch_index})", flush=True)
    trainer.train()
    export = cfg.get("export")
    if export and cfg.get("output_dir") and trainer.dist.is_main:
        path = export_draft(
            trainer.model, Path(cfg["output_dir"]) / "export", dtype=_DTYPES[export.get("dtype", "bfloat16")]
        )
        print(f"exported {path}", flush=True)
    du.barrier()
    return trainer


def main(argv: Sequence[str] | None = None, train: Callable[[dict[str, Any]], object] = run) -> int:
    """The command line of every rank; ``train`` runs the loaded config (``pipes_train`` adds its reporting)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--backend", default=None, help="process-group backend (default: nccl on GPU, else gloo)")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    du.init_from_env(args.backend)
    try:
        train(cfg)
    finally:
        du.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
