"""``python -m eagle_assets.draft.train_cli --config run.json`` — one process or under ``torchrun``.

    torchrun --standalone --nproc_per_node=8 -m eagle_assets.draft.train_cli --config run.json

The config (JSON, or YAML by suffix) names everything a run needs, so the same file reproduces it. It is a
``DraftRunConfig`` (``run_config.py``: every key with its default; an unknown key is an error that names it).
The store reader is resolved by name at run time (default ``eagle_assets.hidden_states.store:HiddenStateStore``)
so that this module depends only on its ``__len__``/``__getitem__`` contract. A run resumes from
``output_dir/checkpoints`` when a checkpoint is there.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eagle_assets.draft import distributed as du
from eagle_assets.draft.data import RowDataset, StoreDataset, SyntheticDataset, TokenDataset
from eagle_assets.draft.export import export_draft
from eagle_assets.draft.model import Eagle3Config, Eagle3Draft
from eagle_assets.draft.online_stream import OnlineFeatureStream
from eagle_assets.draft.run_config import (
    DraftRunConfig,
    StoreData,
    SyntheticData,
    TokensData,
    VocabSpec,
    load_config,
)
from eagle_assets.draft.target import TargetHead, load_target_embeddings, load_target_head
from eagle_assets.draft.train import StepMetrics, Trainer
from eagle_assets.draft.vocab import DraftVocab, vocab_from_samples

if TYPE_CHECKING:  # only a type here: transformers is imported where a model is loaded
    from transformers import PreTrainedModel

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _load_hf_target(path: str, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    """The target's text causal LM (a vision-language wrapper's too: ``target.loader``), frozen, on ``device``."""
    from eagle_assets.target.loader import load_target

    model: PreTrainedModel = load_target(path, device, dtype)
    return model.requires_grad_(False)


def _target_path(cfg: DraftRunConfig) -> str:
    if not cfg.target.path:  # DraftRunConfig refuses a run that needs the target and does not name it
        raise ValueError("this run needs target.path")
    return cfg.target.path


def _model_config(cfg: DraftRunConfig) -> Eagle3Config:
    if cfg.model is not None:
        return _checked_against_target(Eagle3Config.from_dict(cfg.model), cfg)
    if cfg.draft_vocab_size is None:  # DraftRunConfig refuses this too
        raise ValueError("give either 'model' or 'target.path' (+ 'draft_vocab_size')")
    from eagle_assets.target.architecture import read_target_config

    ids = cfg.aux_layer_ids
    return Eagle3Config.from_target(
        read_target_config(_target_path(cfg)),
        cfg.draft_vocab_size,
        tuple(ids) if ids else None,
    )


def _checked_against_target(config: Eagle3Config, cfg: DraftRunConfig) -> Eagle3Config:
    """A hand-written model's aux layer ids validated against the target's layer count (1..N-1), as the store's
    ``AuxLayers`` are: without N, ``Eagle3Config`` can only check ids >= 1, so (2, 30, 9999) would train.

    N comes from the target's ``config.json`` (every run on real features names the target); a model that gives
    ``target_num_layers`` must agree with it. Only synthetic data, which has no target, keeps ids unchecked above.
    """
    if not cfg.target.path:
        return config
    from eagle_assets.target.architecture import read_target_dims

    n = read_target_dims(cfg.target.path).num_layers
    if config.target_num_layers and config.target_num_layers != n:
        raise ValueError(
            f"model.target_num_layers is {config.target_num_layers}, the target at {cfg.target.path} has {n} layers"
        )
    return replace(config, target_num_layers=n)  # __post_init__ validates the aux ids against n


def _vocab(spec: VocabSpec, dataset: RowDataset, config: Eagle3Config) -> DraftVocab:
    if spec.kind == "identity":
        return DraftVocab.identity(config.draft_vocab_size, config.target_vocab_size)
    if spec.kind == "file":
        path = Path(spec.path or "")
        if path.is_dir():  # an export folder
            from safetensors.torch import load_file

            d2t = load_file(str(path / "model.safetensors"))["d2t"]
        else:
            d2t = torch.load(path, map_location="cpu", weights_only=True)["d2t"]
        return DraftVocab.from_d2t(d2t, config.target_vocab_size)
    rows = (dataset[i] for i in range(len(dataset)))
    return vocab_from_samples(rows, config.target_vocab_size, config.draft_vocab_size, spec.force_ids)


def _online(
    cfg: DraftRunConfig, data: TokensData, config: Eagle3Config, dataset: TokenDataset, device: torch.device
) -> tuple[OnlineFeatureStream, torch.nn.Module, torch.Tensor | None]:
    """The online stream (resolved by name: the extraction's per-batch function lives in ``hidden_states``), the
    target's head and, when the target runs here, its embedding matrix."""
    model, embed = None, None
    if data.backend == "hf":
        model = _load_hf_target(_target_path(cfg), _DTYPES[cfg.target.dtype], device)
        weight = model.get_input_embeddings().weight
        assert isinstance(weight, torch.Tensor)  # a Parameter; a Module's attributes are typed Tensor | Module
        # its own modules, with the final norm for a pre-norm last state (as a pre-norm store is read)
        head, embed = TargetHead.from_model(model, cfg.target.last_kind), weight.detach().float().cpu()
    else:  # the target runs in its engines: only its head here
        head = load_target_head(_target_path(cfg), cfg.target.last_kind).to(device)
    scratch = cfg.out / "online-scratch" if cfg.out is not None else None
    stream = _resolve(data.stream)(
        data,
        target=cfg.target,
        layer_ids=config.aux_layer_ids,
        dataset=dataset,
        head=head,
        model=model,
        device=device,
        scratch_root=scratch,
    )
    return stream, head, embed


def build(
    cfg: DraftRunConfig | Mapping[str, Any],
    device: torch.device | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
) -> Trainer:
    """Everything from the config, in a fixed order so that every rank builds the same run."""
    cfg = DraftRunConfig.model_validate(cfg)
    device = device or (
        torch.device("cuda", du.current().local_rank) if torch.cuda.is_available() else torch.device("cpu")
    )
    config = _model_config(cfg)
    data, target, out, tc = cfg.data, cfg.target, cfg.out, cfg.train
    if out is not None and not tc.checkpoint_dir:
        tc = tc.model_copy(update={"checkpoint_dir": str(out / "checkpoints")})

    features = None
    stream: OnlineFeatureStream | None = None
    dataset: RowDataset
    head: torch.nn.Module
    embed: torch.Tensor | None = None  # the target's embedding matrix, when the data source has it at hand
    if isinstance(data, SyntheticData):
        synth = SyntheticDataset(
            data.n_samples,
            hidden_size=config.target_hidden_size,
            vocab_size=config.target_vocab_size,
            n_aux=len(config.aux_layer_ids),
            length=data.length,
            seed=data.seed,
        )
        dataset, head, embed = synth, synth.target_head(), synth.embed_weight
    elif isinstance(data, StoreData):
        store = _resolve(data.reader)(data.path, **data.reader_kwargs)
        dataset = StoreDataset(store, max_length=data.max_length)
        # The store says which side of the final norm its last state is (vLLM's: the input): the head follows it.
        meta = getattr(store, "meta", None)
        head = load_target_head(_target_path(cfg), getattr(meta, "last_kind", target.last_kind))
    else:
        rows = [json.loads(line) for line in Path(data.path).read_text().splitlines() if line.strip()]
        dataset = TokenDataset(rows, max_length=data.max_length)
        stream, head, embed = _online(cfg, data, config, dataset, device)

    kind = cfg.embeddings_kind
    if kind == "random":
        gen = torch.Generator().manual_seed(cfg.embeddings.seed)
        embed = torch.randn(config.target_vocab_size, config.hidden_size, generator=gen)
    elif kind == "target" and embed is None:
        embed = load_target_embeddings(_target_path(cfg))
    if embed is None:  # synthetic embeddings come with synthetic data (DraftRunConfig checks it)
        raise ValueError(f"no {kind} embeddings for {data.kind} data")
    if kind != "target" and not config.save_embeddings:
        # Not the target's matrix: an export without it would be served with the target's, silently.
        config = replace(config, save_embeddings=True)

    torch.manual_seed(cfg.seed)
    draft = Eagle3Draft(config, embed.float())
    draft.set_vocab(_vocab(cfg.vocab, dataset, config))
    log_every = cfg.log_every
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
    return Trainer(draft, dataset, head, tc, features=features, stream=stream, callback=callback, device=device)


def run(
    cfg: DraftRunConfig | Mapping[str, Any],
    device: torch.device | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
) -> Trainer:
    cfg = DraftRunConfig.model_validate(cfg)
    trainer = build(cfg, device, on_step)
    if trainer.resume() and trainer.dist.is_main:
        print(f"resumed at step {trainer.global_step} (epoch {trainer.epoch}, batch {trainer.batch_index})", flush=True)
    trainer.train()
    if cfg.export is not None and cfg.out is not None and trainer.dist.is_main:
        path = export_draft(trainer.model, cfg.out / "export", dtype=_DTYPES[cfg.export.dtype])
        print(f"exported {path}", flush=True)
    du.barrier()
    return trainer


def main(argv: Sequence[str] | None = None, train: Callable[[DraftRunConfig], object] = run) -> int:
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
