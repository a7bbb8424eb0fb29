"""How SGLang and vLLM load an EAGLE-3 draft folder, re-implemented for this project's tests.

Neither engine runs here (no GPU, no network), yet an export is only right if both load it: every tensor
must reach a parameter of the right shape, nothing may be dropped, and the target layers each engine
captures must be the ones the draft was trained on. These functions redo, on plain tensors, what the
public loaders do with a draft folder. They were written for this project from the loaders' behaviour:

SGLang (``python/sglang/srt/models/llama_eagle3.py`` and ``llama.py``, model runner):
  - parameters ``model.embed_tokens``, ``model.fc`` (``3 * target_hidden_size`` inputs, ``target_hidden_size``
    when the config has it, else ``hidden_size``), ``model.midlayer.self_attn.{qkv_proj,o_proj}`` (q/k/v fused,
    ``2 * hidden_size`` inputs, ``head_dim`` from the config, else ``hidden_size // heads``),
    ``model.midlayer.mlp.{gate_up_proj,down_proj}``, ``model.midlayer.{input_layernorm,hidden_norm,
    post_attention_layernorm}``, ``model.norm``, ``lm_head`` (``draft_vocab_size`` rows; none given: the
    target's head is borrowed);
  - ``load_weights``: ``d2t`` becomes ``hot_token_id = d2t + arange``, ``t2d`` is skipped, ``q/k/v_proj`` and
    ``gate/up_proj`` go into their fused shards, a name is tried as is and then with ``model.`` in front,
    and a name that matches no parameter is **silently dropped**; shapes are asserted by the loaders;
  - ``set_embed``: the target's embedding replaces the draft's unless ``target_hidden_size != hidden_size``
    (a folder's own ``embed_tokens.weight`` is then ignored while vLLM serves it: ``check_export`` reports that);
  - layers: only ``eagle_config["eagle_aux_hidden_state_layer_ids"]`` is read, and each id gets ``+1``
    (``set_eagle3_layers_to_capture``); no ids: ``[2, N // 2, N - 3]``. Layer ``i`` is captured at its input.

vLLM (``vllm/model_executor/models/llama_eagle3.py``, ``models/utils.py``, the model loader, the GPU model
runner and the EAGLE proposer):
  - parameters ``model.embed_tokens``, ``model.layers.0.self_attn.{qkv_proj,o_proj}``,
    ``model.layers.0.mlp.{gate_up_proj,down_proj}``, ``model.layers.0.{input_layernorm,hidden_norm,
    post_attention_layernorm}``, ``model.fc`` (when ``eagle_config.use_aux_hidden_state``, default true),
    ``model.norm``, ``lm_head``, ``draft_id_to_target_id``;
  - ``Eagle3LlamaForCausalLM.load_weights``: ``t2d`` skipped, ``d2t`` renamed ``draft_id_to_target_id``,
    every other name but ``lm_head`` prefixed ``model.``; absent ``d2t``/``embed_tokens`` are added to
    ``skip_substrs``; then ``AutoWeightsLoader`` groups names by their first component, hands ``model.*``
    to ``LlamaModel.load_weights`` (``midlayer.`` → ``layers.0.``, fused shards, ``params_dict[name]``:
    an unknown name is an error) and loads the rest into parameters (a name that is neither a module nor
    a parameter is an error); ``default_weight_loader`` asserts the shape; afterwards every parameter must
    have been loaded ("Following weights were not initialized from checkpoint");
  - embedding: the draft's own when the file has one, else the target's (shared by the proposer);
  - layers: the top-level ``eagle_aux_hidden_state_layer_ids`` as given; newer versions fall back to
    ``eagle_config``'s (as given); none: ``(2, N // 2, N - 3)``. Layer ``idx`` is captured at its input.

Everything works on ``meta`` tensors too, so a Kimi-sized geometry is checked without its 3 GB of weights.
``python -m tests.draft.engine_loaders <export folder> --trained-layers 2,30,58 --target-layers 61`` checks
a folder made elsewhere (the demo's ``.eagle_forge/draft/latest/export``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ShardId = str | int | None
Weights = Iterable[tuple[str, torch.Tensor]]
STACKED = ((".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"))
STACKED_MLP = ((".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))


class EngineLoadError(ValueError):
    """What the engine would raise (a shape assertion, an unknown name, a weight left uninitialised)."""


class EngineParam:
    """One engine parameter: its shape, its fused shards (row ranges), and which parts a load filled."""

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        *,
        shards: Mapping[ShardId, tuple[int, int]] | None = None,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> None:
        self.name = name
        self._shape, self._dtype, self._device = tuple(shape), dtype, device
        self._data: torch.Tensor | None = None  # allocated on first load: a shared embedding never is
        self.shards = dict(shards or {})
        self.filled: set[ShardId] = set()

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def data(self) -> torch.Tensor:
        if self._data is None:
            self._data = torch.zeros(self._shape, dtype=self._dtype, device=self._device)
        return self._data

    def load(self, weight: torch.Tensor, shard: ShardId = None) -> None:
        if shard is None:
            if tuple(weight.shape) != self.shape:
                raise EngineLoadError(f"{self.name}: weight {tuple(weight.shape)} into parameter {self.shape}")
            self.data.copy_(weight)
        else:
            start, size = self.shards[shard]
            expected = (size, *self.shape[1:])
            if tuple(weight.shape) != expected:
                raise EngineLoadError(f"{self.name}[{shard}]: weight {tuple(weight.shape)}, shard needs {expected}")
            self.data[start : start + size].copy_(weight)
        self.filled.add(shard)

    @property
    def complete(self) -> bool:
        return None in self.filled or (bool(self.shards) and set(self.shards) <= self.filled)

    def shard(self, shard: ShardId) -> torch.Tensor:
        start, size = self.shards[shard]
        return self.data[start : start + size]


@dataclass
class Geometry:
    """The draft config.json as both engines' ``LlamaConfig``-based code reads it."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int
    lm_head_from_target: bool
    fc_in: int
    tie_word_embeddings: bool
    target_hidden_differs: bool

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> Geometry:
        if int(cfg.get("num_hidden_layers", 1)) != 1:
            raise EngineLoadError("only one-layer drafts are re-implemented here (both engines add plain layers)")
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        target_hidden = int(cfg["target_hidden_size"]) if cfg.get("target_hidden_size") is not None else hidden
        draft_vocab = cfg.get("draft_vocab_size")
        return cls(
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            draft_vocab=int(draft_vocab or cfg["vocab_size"]),
            lm_head_from_target=draft_vocab is None,
            fc_in=3 * target_hidden,  # both engines: fc = Linear(target_hidden_size * 3, hidden_size)
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            target_hidden_differs=cfg.get("target_hidden_size") is not None and target_hidden != hidden,
        )

    def qkv_shards(self) -> dict[ShardId, tuple[int, int]]:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}

    def layer_params(self, prefix: str, device: str) -> dict[str, EngineParam]:
        h, inter = self.hidden, self.intermediate
        qkv_rows = (self.heads + 2 * self.kv_heads) * self.head_dim
        specs: dict[str, tuple[tuple[int, ...], dict[ShardId, tuple[int, int]] | None]] = {
            "self_attn.qkv_proj.weight": ((qkv_rows, 2 * h), self.qkv_shards()),
            "self_attn.o_proj.weight": ((h, self.heads * self.head_dim), None),
            "mlp.gate_up_proj.weight": ((2 * inter, h), {0: (0, inter), 1: (inter, inter)}),
            "mlp.down_proj.weight": ((h, inter), None),
            "input_layernorm.weight": ((h,), None),
            "hidden_norm.weight": ((h,), None),
            "post_attention_layernorm.weight": ((h,), None),
        }
        return {
            f"{prefix}{n}": EngineParam(f"{prefix}{n}", shape, shards=shards, device=device)
            for n, (shape, shards) in specs.items()
        }


@dataclass
class EngineLoad:
    """What one engine ends up serving from a folder."""

    engine: str
    params: dict[str, EngineParam]
    captured_hf_layers: tuple[int, ...]  # HF output_hidden_states indices (= inputs of these decoder layers)
    embedding_source: str  # "draft" (the folder's) or "target"
    lm_head_source: str
    d2t: torch.Tensor | None
    dropped: list[str] = field(default_factory=list)

    def problems(self, geometry: Geometry) -> list[str]:
        """Everything that would make the engine serve something other than the trained draft."""
        out = [f"{self.engine} silently dropped {n}" for n in self.dropped]
        for name, p in self.params.items():
            shared = ("embed_tokens" in name and self.embedding_source == "target") or (
                name.endswith("lm_head.weight") and self.lm_head_source == "target"
            )
            if not p.complete and not shared:
                out.append(f"{self.engine} left {name} {p.shape} uninitialised")
        if self.embedding_source == "target" and geometry.target_hidden_differs:
            out.append(
                f"{self.engine} would take the target's embedding (target_hidden_size wide) for a draft of "
                f"width {geometry.hidden}: the folder must carry embed_tokens.weight"
            )
        if self.d2t is None and geometry.draft_vocab != geometry.vocab:
            out.append(
                f"{self.engine} has no d2t for a reduced draft vocabulary: draft ids would be read as target ids"
            )
        return out


def _read(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


def default_layers(num_layers: int) -> tuple[int, ...]:
    return (2, num_layers // 2, num_layers - 3)


# ---------------------------------------------------------------------------------------------- SGLang


def sglang_layers(cfg: Mapping[str, Any], target_num_layers: int) -> tuple[int, ...]:
    """Model runner: ``eagle_config["eagle_aux_hidden_state_layer_ids"]`` or None; then ``+1`` per id."""
    try:
        ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    except (KeyError, TypeError):
        ids = None
    if ids is None:
        return default_layers(target_num_layers)
    return tuple(int(i) + 1 for i in ids)


def sglang_params(g: Geometry, device: str = "meta") -> dict[str, EngineParam]:
    """``LlamaForCausalLMEagle3(config).named_parameters()`` (one midlayer, untied head)."""
    params = {
        "model.embed_tokens.weight": EngineParam("model.embed_tokens.weight", (g.vocab, g.hidden), device=device),
        "model.fc.weight": EngineParam("model.fc.weight", (g.hidden, g.fc_in), device=device),
        **g.layer_params("model.midlayer.", device),
        "model.norm.weight": EngineParam("model.norm.weight", (g.hidden,), device=device),
    }
    if not g.tie_word_embeddings:
        params["lm_head.weight"] = EngineParam("lm_head.weight", (g.draft_vocab, g.hidden), device=device)
    return params


def sglang_load(
    cfg: Mapping[str, Any], weights: Mapping[str, torch.Tensor], target_num_layers: int, device: str = "cpu"
) -> EngineLoad:
    g = Geometry.of(cfg)
    params = sglang_params(g, device)
    hot: torch.Tensor | None = None
    dropped: list[str] = []
    for name, w in weights.items():
        if "d2t" in name:
            hot = w + torch.arange(w.shape[0], device=w.device)
            continue
        if "t2d" in name:
            continue
        for param_name, weight_name, shard in (*STACKED, *STACKED_MLP):
            if weight_name not in name:
                continue
            fused = name.replace(weight_name, param_name)
            key = fused if fused in params else f"model.{fused}"
            if key in params:
                params[key].load(w, shard)
            else:
                dropped.append(name)
            break
        else:
            key = name if name in params else f"model.{name}"
            if key in params:
                params[key].load(w)
            else:
                dropped.append(name)
    return EngineLoad(
        engine="sglang",
        params=params,
        captured_hf_layers=sglang_layers(cfg, target_num_layers),
        # set_embed: shared unless the config says the widths differ
        embedding_source="draft" if g.target_hidden_differs else "target",
        lm_head_source="target" if g.lm_head_from_target else "draft",
        d2t=None if hot is None else hot - torch.arange(hot.shape[0], device=hot.device),
        dropped=dropped,
    )


# ------------------------------------------------------------------------------------------------ vLLM


def vllm_layers(cfg: Mapping[str, Any], target_num_layers: int, eagle_config_fallback: bool = True) -> tuple[int, ...]:
    """GPU model runner: the top-level ids as given; newer versions then try ``eagle_config``'s; else the default."""
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not (ids and isinstance(ids, list | tuple)) and eagle_config_fallback:
        nested = cfg.get("eagle_config")
        ids = nested.get("eagle_aux_hidden_state_layer_ids") if isinstance(nested, dict) else None
    if ids and isinstance(ids, list | tuple):
        return tuple(int(i) for i in ids)
    return default_layers(target_num_layers)


@dataclass
class _Module:
    params: dict[str, EngineParam] = field(default_factory=dict)
    children: dict[str, _Module] = field(default_factory=dict)
    load_weights: Callable[[Weights], set[str]] | None = None


class AutoWeightsLoader:
    """vLLM's prefix-grouped dispatch over a module tree (``skip_substrs`` as the EAGLE-3 loader sets them)."""

    ROTARY = ("rotary_pos_emb.inv_freq", "rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")

    def __init__(self, root: _Module, skip_substrs: Sequence[str]) -> None:
        self.root = root
        self.skip_substrs = [*skip_substrs, *self.ROTARY]

    def _skip(self, qualname: str) -> bool:
        return any(s in qualname for s in self.skip_substrs)

    @staticmethod
    def _qualname(prefix: str, rest: str) -> str:
        return rest if not prefix else prefix if not rest else f"{prefix}.{rest}"

    def load_weights(self, weights: Weights) -> set[str]:
        return set(self._load_module("", self.root, ((n, w) for n, w in weights if not self._skip(n))))

    def _load_module(self, base: str, module: _Module, weights: Weights) -> Iterator[str]:
        if module is not self.root and module.load_weights is not None:
            yield from (self._qualname(base, n) for n in module.load_weights(weights))
            return
        parts = ((name.split(".", 1), w) for name, w in weights)
        for child, group in itertools.groupby(parts, key=lambda x: x[0][0]):
            rest = (("" if len(p) == 1 else p[1], w) for p, w in group)
            prefix = self._qualname(base, child)
            if child in module.children:
                if not self._skip(prefix + "."):
                    yield from self._load_module(prefix, module.children[child], rest)
            elif child in module.params:
                if not self._skip(prefix):
                    yield from self._load_param(prefix, module.params[child], rest)
            elif not (self._skip(prefix + ".") or self._skip(prefix)):
                raise EngineLoadError(f"There is no module or parameter named '{prefix}' in Eagle3LlamaForCausalLM")

    def _load_param(self, base: str, param: EngineParam, weights: Weights) -> Iterator[str]:
        for name, w in weights:
            qual = self._qualname(base, name)
            if self._skip(qual):
                continue
            if name:
                raise EngineLoadError(f"Attempted to load nested weight '{qual}' into a single parameter '{base}'")
            param.load(w)
            yield qual


def _use_aux(cfg: Mapping[str, Any]) -> bool:
    return bool((cfg.get("eagle_config") or {}).get("use_aux_hidden_state", True))


def vllm_params(g: Geometry, use_aux: bool = True, device: str = "meta") -> dict[str, EngineParam]:
    """``Eagle3LlamaForCausalLM(config).named_parameters()`` (one layer, ``fc`` when aux states are used)."""
    params = {
        "model.embed_tokens.weight": EngineParam("model.embed_tokens.weight", (g.vocab, g.hidden), device=device),
        **g.layer_params("model.layers.0.", device),
        "model.norm.weight": EngineParam("model.norm.weight", (g.hidden,), device=device),
        "lm_head.weight": EngineParam("lm_head.weight", (g.draft_vocab, g.hidden), device=device),
        "draft_id_to_target_id": EngineParam(
            "draft_id_to_target_id", (g.draft_vocab,), dtype=torch.long, device=device
        ),
    }
    if use_aux:
        params["model.fc.weight"] = EngineParam("model.fc.weight", (g.hidden, g.fc_in), device=device)
    return params


def engine_param_shapes(cfg: Mapping[str, Any], engine: str) -> dict[str, tuple[int, ...]]:
    """The parameters an engine builds for a draft ``config.json``, by name, without loading anything."""
    g = Geometry.of(cfg)
    params = sglang_params(g) if engine == "sglang" else vllm_params(g, _use_aux(cfg))
    return {n: p.shape for n, p in params.items()}


def vllm_load(
    cfg: Mapping[str, Any],
    weights: Mapping[str, torch.Tensor],
    target_num_layers: int,
    device: str = "cpu",
    eagle_config_fallback: bool = True,
) -> EngineLoad:
    g = Geometry.of(cfg)
    use_aux = _use_aux(cfg)
    params = vllm_params(g, use_aux, device)
    lm_head, d2t = params["lm_head.weight"], params["draft_id_to_target_id"]
    inner = {n.removeprefix("model."): p for n, p in params.items() if n.startswith("model.")}

    def llama_model_load_weights(ws: Weights) -> set[str]:
        loaded: set[str] = set()
        for name, w in ws:
            name = name.replace("midlayer.", "layers.0.")
            for param_name, weight_name, shard in (*STACKED, *STACKED_MLP):
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                if name not in inner:
                    raise EngineLoadError(f"KeyError: '{name}' (LlamaModel.load_weights)")
                inner[name].load(w, shard)
                break
            else:
                if name not in inner:
                    raise EngineLoadError(f"KeyError: '{name}' (LlamaModel.load_weights)")
                inner[name].load(w)
            loaded.add(name)
        return loaded

    root = _Module(
        params={"draft_id_to_target_id": d2t},
        children={
            "model": _Module(load_weights=llama_model_load_weights),
            "lm_head": _Module(params={"weight": lm_head}),
        },
    )
    renamed: dict[str, torch.Tensor] = {}
    has_d2t = has_embed = has_head = False
    for name, w in weights.items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
            has_d2t = True
        elif "lm_head" not in name:
            name = "model." + name
        has_embed |= "embed_tokens" in name
        has_head |= "lm_head" in name
        renamed[name] = w
    skip = [s for s, present in (("draft_id_to_target_id", has_d2t), ("embed_tokens", has_embed)) if not present]
    if not use_aux:
        skip.append("fc.")
    loaded = AutoWeightsLoader(root, skip).load_weights(renamed.items())
    expected = {n for n in params if not ("embed_tokens" in n and not has_embed)}  # shared by the proposer
    if not has_head:
        expected.discard("lm_head.weight")
    missing = sorted(expected - loaded)
    if missing:
        raise EngineLoadError(f"Following weights were not initialized from checkpoint: {missing}")
    return EngineLoad(
        engine="vllm",
        params=params,
        captured_hf_layers=vllm_layers(cfg, target_num_layers, eagle_config_fallback),
        embedding_source="draft" if has_embed else "target",
        lm_head_source="draft" if has_head else "target",
        d2t=d2t.data if has_d2t else None,
    )


# --------------------------------------------------------------------------------------- shared checks

ENGINES: dict[str, Callable[..., EngineLoad]] = {"sglang": sglang_load, "vllm": vllm_load}


def load_folder(folder: str | Path, engine: str, target_num_layers: int) -> EngineLoad:
    cfg, weights = _read(Path(folder))
    return ENGINES[engine](cfg, weights, target_num_layers)


def project_state_dict(load: EngineLoad, target_embedding: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The engine's loaded parameters, unfused back to this project's names (for a forward comparison)."""
    layer = "model.midlayer." if load.engine == "sglang" else "model.layers.0."
    out: dict[str, torch.Tensor] = {}
    for name, p in load.params.items():
        if name.endswith("qkv_proj.weight"):
            for s in ("q", "k", "v"):
                out[f"midlayer.self_attn.{s}_proj.weight"] = p.shard(s)
        elif name.endswith("gate_up_proj.weight"):
            out["midlayer.mlp.gate_proj.weight"], out["midlayer.mlp.up_proj.weight"] = p.shard(0), p.shard(1)
        elif name.startswith(layer):
            out["midlayer." + name.removeprefix(layer)] = p.data
        elif name in ("model.fc.weight", "model.norm.weight", "lm_head.weight"):
            out[name.removeprefix("model.")] = p.data
    if load.embedding_source == "draft":
        out["embed_tokens.weight"] = load.params["model.embed_tokens.weight"].data
    elif target_embedding is not None:
        out["embed_tokens.weight"] = target_embedding
    if load.d2t is not None:
        out["d2t"] = load.d2t
    return out


@torch.no_grad()
def capture_layer_inputs(model: Any, input_ids: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """What both engines hand the draft: the residual stream at the *input* of each decoder layer, concatenated.

    SGLang appends ``hidden_states + residual`` before running layer ``i`` for ``i`` in ``layers_to_capture``;
    vLLM appends the layer input for ``idx`` in ``aux_hidden_state_layers``. On a Hugging Face model that is
    the ``hidden_states`` argument of ``model.model.layers[i]``, caught here by a pre-hook.
    """
    decoder_layers = model.get_decoder().layers
    seen: dict[int, torch.Tensor] = {}
    hooks = []
    for i in layers:
        if not 0 <= i < len(decoder_layers):
            raise EngineLoadError(f"layer {i} is not a decoder layer input of a {len(decoder_layers)}-layer target")

        def grab(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any], i: int = i) -> None:
            seen[i] = args[0] if args else kwargs["hidden_states"]

        hooks.append(decoder_layers[i].register_forward_pre_hook(grab, with_kwargs=True))
    try:
        model.get_decoder()(input_ids=input_ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([seen[i] for i in layers], dim=-1)


@dataclass
class FolderCheck:
    loads: dict[str, EngineLoad]
    problems: list[str]


def check_export(folder: str | Path, trained_hf_layers: Sequence[int], target_num_layers: int) -> FolderCheck:
    """Load ``folder`` as each engine would; list whatever differs from the draft as trained."""
    cfg, weights = _read(Path(folder))
    g = Geometry.of(cfg)
    loads: dict[str, EngineLoad] = {}
    problems: list[str] = []
    for engine, load in ENGINES.items():
        try:
            loads[engine] = load(cfg, weights, target_num_layers)
        except EngineLoadError as exc:
            problems.append(f"{engine} refuses the folder: {exc}")
            continue
        problems += loads[engine].problems(g)
        if loads[engine].captured_hf_layers != tuple(trained_hf_layers):
            problems.append(
                f"{engine} captures the inputs of layers {list(loads[engine].captured_hf_layers)}, "
                f"the draft was trained on {list(trained_hf_layers)}"
            )
    problems += embedding_disagreement(loads, has_embedding="embed_tokens.weight" in weights)
    return FolderCheck(loads, problems)


def embedding_disagreement(loads: Mapping[str, EngineLoad], *, has_embedding: bool) -> list[str]:
    """The folder carries the draft's own embedding, and some engine serves the target's instead.

    SGLang's ``set_embed`` replaces it whenever the draft is as wide as its target; vLLM keeps it. Each engine
    loads the folder without complaint, yet they serve two different drafts: a problem, not an "ok".
    """
    ignoring = sorted(e for e, load in loads.items() if load.embedding_source == "target")
    if not has_embedding or not ignoring:
        return []
    keeping = sorted(set(loads) - set(ignoring))
    return [
        f"{' and '.join(ignoring)} would serve the target's embedding in place of the folder's embed_tokens.weight "
        "(SGLang's set_embed whenever hidden_size == target_hidden_size)"
        + (f", {' and '.join(keeping)} the draft's own: the engines serve different drafts" if keeping else "")
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check an EAGLE-3 export against SGLang's and vLLM's loaders.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--trained-layers", required=True, help="HF output_hidden_states indices, e.g. 2,30,58")
    parser.add_argument("--target-layers", type=int, required=True, help="decoder layers of the target")
    args = parser.parse_args(argv)
    trained = [int(x) for x in args.trained_layers.split(",")]
    result = check_export(args.folder, trained, args.target_layers)
    for engine, load in result.loads.items():
        shapes = {n: list(p.shape) for n, p in load.params.items()}
        print(
            json.dumps(
                {
                    "engine": engine,
                    "captured_hf_layers": list(load.captured_hf_layers),
                    "embedding": load.embedding_source,
                    "lm_head": load.lm_head_source,
                    "params": shapes,
                }
            )
        )
    for p in result.problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print("ok" if not result.problems else f"{len(result.problems)} problem(s)")
    return 1 if result.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
