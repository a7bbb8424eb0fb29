"""Draft training loop: AdamW + warmup/cosine, gradient clipping, TTT loss, exact resume, data parallel.

Design choices that make runs reproducible and comparable:

- **Global token normalisation.** Each TTT step's summed loss is divided by the number of
  loss-masked positions of that step over the *whole* global batch (all ranks, all accumulation
  micro-batches), counted from the masks before any forward. Data-parallel and accumulated runs
  therefore optimise exactly the objective of one process holding the global batch; the only
  differences are floating-point summation order and per-rank padding.
- **Exact resume**: the data order is a function of (seed, epoch, batch index) (``data.py``), and rank 0 writes
  atomic checkpoints (``checkpoint.py``; older ones pruned to ``keep_checkpoints``) holding the trainable weights
  and vocabulary buffers (not the frozen target embedding), optimizer, scheduler, every rank's RNG states, the
  data position and the best simulated τ so far. Every rank reads the checkpoint on resume, so
  ``checkpoint_dir`` must be on a disk all ranks share.
- **bf16 autocast on CUDA only**; fp32 master weights, fp32 softmax/loss. CPU runs stay fp32 so that
  exactness tests are meaningful.
- **Online mode**: pass ``stream`` (``online_stream.OnlineFeatureStream``) and a dataset of token rows; or,
  simpler and synchronous, ``features(input_ids) -> (aux, last)``, run inside the training step under ``no_grad``.

The metrics callback runs on rank 0 after every optimizer step with globally reduced numbers.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eagle_assets.draft import distributed as du
from eagle_assets.draft.checkpoint import (
    LATEST,
    atomic_torch_save,
    latest_checkpoint,
    rng_state,
    set_rng_state,
)
from eagle_assets.draft.data import RowDataset, collate, global_batch_indices, local_slice, steps_per_epoch
from eagle_assets.draft.model import Eagle3Draft
from eagle_assets.draft.online_stream import OnlineFeatureStream
from eagle_assets.draft.run_config import TrainConfig
from eagle_assets.draft.ttt import (
    HeadFn,
    loss_mask_counts,
    needed_target_positions,
    resolve_attn_impl,
    simulated_acceptance,
    step_accuracies,
    target_distribution,
    ttt_forward,
)
from eagle_assets.durable_files import atomic_write_text

CHECKPOINT_FORMAT = "eagle-forge-draft-checkpoint"
CHECKPOINT_VERSION = 1
BEST = "best.pt"

Features = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class StepMetrics:
    step: int
    epoch: int
    lr: float
    loss: float
    step_loss: list[float]  # mean soft cross-entropy per TTT step over loss-masked positions
    acc: list[float]
    sim_accept: float  # Σ_k Π_{j≤k} acc_j
    sim_tau: float  # 1 + sim_accept (tokens per target forward, bonus token included)
    grad_norm: float
    tokens: int  # real (non-padding) tokens in the global batch
    tokens_per_s: float
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class EvalMetrics:
    loss: float
    acc: list[float]
    sim_accept: float
    sim_tau: float
    tokens: int


def lr_lambda(total_steps: int, warmup_ratio: float, min_lr_ratio: float = 0.0) -> Callable[[int], float]:
    """Linear warmup over ``ceil(ratio × total)`` steps (first step non-zero), then cosine to ``min_lr_ratio``."""
    warmup = max(1, math.ceil(warmup_ratio * total_steps)) if warmup_ratio > 0 else 0

    def fn(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return fn


class TTTModule(nn.Module):
    """The unit DDP wraps: one forward = the whole K-step unroll, so gradient hooks fire once per backward."""

    def __init__(self, draft: Eagle3Draft, steps: int, step_weight: float, attn_impl: str):
        super().__init__()
        self.draft = draft
        self.steps, self.step_weight, self.attn_impl = steps, step_weight, attn_impl

    def forward(
        self,
        aux: torch.Tensor,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        target_p: torch.Tensor,
        target_top: torch.Tensor,
        denominators: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        out = ttt_forward(
            self.draft,
            aux,
            input_ids,
            loss_mask,
            target_p,
            target_top,
            steps=self.steps,
            step_weight=self.step_weight,
            denominators=denominators,
            attn_impl=self.attn_impl,
        )
        assert not isinstance(out, tuple)
        return out.loss, out.loss_sum, out.correct, out.count


class Trainer:
    """Train an ``Eagle3Draft`` on a row dataset (offline features) or token rows + ``features`` (online)."""

    def __init__(
        self,
        model: Eagle3Draft,
        dataset: RowDataset,
        target_head: HeadFn,
        config: TrainConfig | None = None,
        *,
        features: Features | None = None,
        stream: OnlineFeatureStream | None = None,
        callback: Callable[[StepMetrics], None] | None = None,
        eval_dataset: RowDataset | None = None,
        eval_callback: Callable[[int, EvalMetrics], None] | None = None,
        device: torch.device | str | None = None,
    ):
        self.config = config or TrainConfig()
        self.dist = du.current()
        if device is None:
            device = torch.device("cuda", self.dist.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.dataset, self.eval_dataset = dataset, eval_dataset
        self.target_head, self.features, self.stream = target_head, features, stream
        if stream is not None:
            stream.row = self._row  # the stream reads rows as this trainer does (max_length truncation)
        self.callback, self.eval_callback = callback, eval_callback
        cfg = self.config
        self.attn_impl = resolve_attn_impl(cfg.attn_impl, self.device)
        self.module: nn.Module = TTTModule(self.model, cfg.ttt_steps, cfg.step_weight, self.attn_impl)
        if self.dist.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.module = nn.parallel.DistributedDataParallel(self.module, device_ids=ids, broadcast_buffers=False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.global_batch = cfg.batch_size * cfg.grad_accum * self.dist.world_size
        self.steps_per_epoch = steps_per_epoch(len(dataset), self.global_batch)
        if self.steps_per_epoch == 0:
            raise ValueError(f"dataset of {len(dataset)} rows is smaller than one global batch ({self.global_batch})")
        self.total_steps = cfg.max_steps or cfg.epochs * self.steps_per_epoch
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(self.total_steps, cfg.warmup_ratio, cfg.min_lr_ratio)
        )
        self.global_step = 0
        self.epoch = 0
        self.batch_index = 0
        self.best_sim_tau = -math.inf
        self.best_step = -1
        self._saved_step = -1  # step of the last checkpoint this run wrote or loaded
        self.use_bf16 = cfg.bf16 and self.device.type == "cuda"

    # ------------------------------------------------------------------ data

    def _row(self, i: int) -> dict[str, torch.Tensor]:
        row = dict(self.dataset[i])
        n = self.config.max_length
        if n:
            row = {k: (v[:n] if torch.is_tensor(v) and v.ndim >= 1 else v) for k, v in row.items()}
        return row

    def micro_batch_rows(self, epoch: int, batch_index: int) -> list[list[int]]:
        """This rank's dataset rows of each micro-batch of global batch ``batch_index`` of ``epoch``."""
        cfg = self.config
        indices = global_batch_indices(len(self.dataset), self.global_batch, cfg.seed, epoch, batch_index, cfg.shuffle)
        return [
            local_slice(indices, self.dist.rank, self.dist.world_size, m, cfg.batch_size) for m in range(cfg.grad_accum)
        ]

    def _micro_batches(self) -> list[dict[str, torch.Tensor]]:
        if self.stream is not None:  # online: the rows' features computed ahead by the target
            position, remaining = (self.epoch, self.batch_index), self.total_steps - self.global_step
            return self.stream.take(self.micro_batch_rows, position, remaining, self.steps_per_epoch).batches
        rows = self.micro_batch_rows(self.epoch, self.batch_index)
        return [collate([self._row(i) for i in micro], self.config.pad_id) for micro in rows]

    def _advance(self) -> None:
        self.batch_index += 1
        if self.batch_index >= self.steps_per_epoch:
            self.epoch += 1
            self.batch_index = 0

    def _features(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.features is not None:
            with torch.no_grad():
                aux, last = self.features(batch["input_ids"])
            return aux.detach(), last.detach()
        if "aux" not in batch or "last" not in batch:
            raise KeyError("offline training needs 'aux' and 'last' in every row (or pass features=...)")
        return batch["aux"], batch["last"]

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.use_bf16:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ training

    def train_step(self) -> StepMetrics:
        cfg = self.config
        t0 = time.perf_counter()
        self.model.train()
        batches = self._micro_batches()
        k = cfg.ttt_steps
        counts = sum((loss_mask_counts(b["loss_mask"], k) for b in batches), torch.zeros(k, dtype=torch.float64))
        tokens = torch.tensor([float(sum(int(b["lengths"].sum()) for b in batches))], dtype=torch.float64)
        reduced = du.all_reduce_sum(torch.cat([counts, tokens]))
        global_counts, global_tokens = reduced[:k], int(reduced[k])
        denominators = (global_counts.clamp_min(1.0) / self.dist.world_size).to(self.device)
        stats = torch.zeros(3, k, dtype=torch.float64, device=self.device)
        for m, batch in enumerate(batches):
            batch = {key: v.to(self.device) for key, v in batch.items()}
            aux, last = self._features(batch)
            target_p, target_top = target_distribution(
                last,
                self.target_head,
                self.model.used_ids(),
                cfg.target_chunk_tokens,
                needed=needed_target_positions(batch["loss_mask"]),
            )
            ddp = self.module if isinstance(self.module, nn.parallel.DistributedDataParallel) else None
            ctx = contextlib.nullcontext() if m == len(batches) - 1 or ddp is None else ddp.no_sync()
            with ctx:
                with self._autocast():
                    loss, loss_sum, correct, count = self.module(
                        aux, batch["input_ids"], batch["loss_mask"], target_p, target_top, denominators
                    )
                loss.backward()
            stats += torch.stack([loss_sum, correct, count])
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip) if cfg.grad_clip > 0 else None
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        epoch = self.epoch
        self._advance()
        stats = du.all_reduce_sum(stats).cpu()
        seconds = time.perf_counter() - t0
        return self._metrics(stats, global_counts, epoch, lr, grad_norm, global_tokens, seconds)

    def _metrics(
        self,
        stats: torch.Tensor,
        counts: torch.Tensor,
        epoch: int,
        lr: float,
        grad_norm: torch.Tensor | None,
        tokens: int,
        seconds: float,
    ) -> StepMetrics:
        loss_sum, correct, count = stats
        w = torch.tensor([self.config.step_weight**i for i in range(len(loss_sum))], dtype=torch.float64)
        acc = step_accuracies(correct.tolist(), count.tolist())
        sim = simulated_acceptance(acc)
        return StepMetrics(
            step=self.global_step,
            epoch=epoch,
            lr=float(lr),
            loss=float((w * loss_sum / counts.clamp_min(1.0)).sum()),
            step_loss=(loss_sum / count.clamp_min(1.0)).tolist(),
            acc=acc,
            sim_accept=sim,
            sim_tau=1.0 + sim,
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            tokens=tokens,
            tokens_per_s=tokens / seconds if seconds > 0 else float("inf"),
            seconds=seconds,
        )

    def train(self, stop_after: int | None = None) -> list[StepMetrics]:
        """Run to ``total_steps`` (or stop once ``global_step == stop_after``, as an interruption would)."""
        cfg = self.config
        history: list[StepMetrics] = []
        try:
            while self.global_step < self.total_steps and (stop_after is None or self.global_step < stop_after):
                metrics = self.train_step()
                history.append(metrics)
                if self.callback is not None and self.dist.is_main:
                    self.callback(metrics)
                if self.eval_dataset is not None and cfg.eval_every and self.global_step % cfg.eval_every == 0:
                    self._eval_and_keep_best()
                if cfg.checkpoint_dir and cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0:
                    self.save_checkpoint()
        finally:
            if self.stream is not None:
                self.stream.close()  # the producer thread stops; a later train() starts it again where it stands
        # Decided from in-memory state, not the filesystem: every rank must take the same branch
        # (saving is collective) even where ranks do not share a disk.
        if cfg.checkpoint_dir and self.global_step == self.total_steps and self._saved_step != self.global_step:
            self.save_checkpoint()
        return history

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, dataset: RowDataset | None = None, batch_size: int | None = None) -> EvalMetrics:
        """TTT metrics over a dataset (rows sharded over ranks, sums reduced globally)."""
        dataset = dataset if dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("no evaluation dataset")
        cfg = self.config
        k = cfg.ttt_steps
        self.model.eval()
        bs = batch_size or cfg.batch_size
        mine = list(range(self.dist.rank, len(dataset), self.dist.world_size))
        stats = torch.zeros(4, k, dtype=torch.float64)
        tokens = 0
        for i in range(0, len(mine), bs):
            batch = collate([dataset[j] for j in mine[i : i + bs]], cfg.pad_id)
            tokens += int(batch["lengths"].sum())
            batch = {key: v.to(self.device) for key, v in batch.items()}
            aux, last = self._features(batch)
            target_p, target_top = target_distribution(
                last, self.target_head, self.model.used_ids(), needed=needed_target_positions(batch["loss_mask"])
            )
            with self._autocast():
                out = ttt_forward(
                    self.model,
                    aux,
                    batch["input_ids"],
                    batch["loss_mask"],
                    target_p,
                    target_top,
                    steps=k,
                    step_weight=cfg.step_weight,
                    attn_impl=self.attn_impl,
                )
            assert not isinstance(out, tuple)
            stats[:3] += torch.stack([out.loss_sum, out.correct, out.count]).cpu()
        stats[3, 0] = tokens
        stats = du.all_reduce_sum(stats)
        loss_sum, correct, count = stats[:3]
        w = torch.tensor([cfg.step_weight**i for i in range(k)], dtype=torch.float64)
        acc = step_accuracies(correct.tolist(), count.tolist())
        sim = simulated_acceptance(acc)
        return EvalMetrics(float((w * loss_sum / count.clamp_min(1.0)).sum()), acc, sim, 1.0 + sim, int(stats[3, 0]))

    def _eval_and_keep_best(self) -> None:
        metrics = self.evaluate()
        if self.eval_callback is not None and self.dist.is_main:
            self.eval_callback(self.global_step, metrics)
        if metrics.sim_tau > self.best_sim_tau:
            self.best_sim_tau, self.best_step = metrics.sim_tau, self.global_step
            if self.config.checkpoint_dir and self.dist.is_main:
                d = Path(self.config.checkpoint_dir)
                d.mkdir(parents=True, exist_ok=True)
                atomic_torch_save(
                    {
                        "format": CHECKPOINT_FORMAT,
                        "step": self.global_step,
                        "model": self.model.checkpoint_state_dict(),
                        "model_config": self.model.config.to_dict(),
                        "eval": asdict(metrics),
                    },
                    d / BEST,
                )

    # ------------------------------------------------------------------ checkpoints

    @staticmethod
    def _checkpoint_name(step: int) -> str:
        return f"step-{step:08d}.pt"

    def state(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "global_step": self.global_step,
            "data": {
                "epoch": self.epoch,
                "batch_index": self.batch_index,
                "shuffle_seed": cfg.seed,
                "global_batch": self.global_batch,
                "dataset_len": len(self.dataset),
            },
            "model": self.model.checkpoint_state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": du.all_gather_object(rng_state()),
            "best": {"sim_tau": self.best_sim_tau, "step": self.best_step},
            "model_config": self.model.config.to_dict(),
            "train_config": cfg.model_dump(),
            "world_size": self.dist.world_size,
        }

    def save_checkpoint(self, directory: str | Path | None = None) -> Path:
        """Write ``step-XXXXXXXX.pt`` and point ``latest.json`` at it (rank 0 writes; all ranks must call)."""
        d = Path(directory or self.config.checkpoint_dir)
        if not str(d):
            raise ValueError("no checkpoint directory configured")
        state = self.state()  # collective (RNG gather): every rank
        path = d / self._checkpoint_name(self.global_step)
        if self.dist.is_main:
            d.mkdir(parents=True, exist_ok=True)
            atomic_torch_save(state, path)
            atomic_write_text(d / LATEST, json.dumps({"file": path.name, "step": self.global_step}))
            keep = max(1, self.config.keep_checkpoints)
            for old in sorted(d.glob("step-*.pt"))[:-keep]:
                old.unlink(missing_ok=True)
        du.barrier()
        self._saved_step = self.global_step
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a draft training checkpoint")
        data = state["data"]
        mismatch = {
            "shuffle_seed": (data["shuffle_seed"], self.config.seed),
            "global_batch": (data["global_batch"], self.global_batch),
            "dataset_len": (data["dataset_len"], len(self.dataset)),
        }
        bad = {k: v for k, v in mismatch.items() if v[0] != v[1]}
        if bad:
            raise ValueError(f"checkpoint does not continue this run (checkpoint vs now): {bad}")
        self.model.load_checkpoint_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        rngs = state["rng"]
        set_rng_state(rngs[self.dist.rank] if len(rngs) == self.dist.world_size else rngs[0])
        self.global_step = int(state["global_step"])
        self.epoch, self.batch_index = int(data["epoch"]), int(data["batch_index"])
        self.best_sim_tau, self.best_step = float(state["best"]["sim_tau"]), int(state["best"]["step"])
        self._saved_step = self.global_step

    def resume(self, directory: str | Path | None = None) -> bool:
        """Load the latest checkpoint of ``directory`` (default: the configured one); False when there is none."""
        d = directory or self.config.checkpoint_dir
        path = latest_checkpoint(d) if d else None
        if path is None:
            return False
        self.load_checkpoint(path)
        return True
