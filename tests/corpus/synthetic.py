"""Synthetic tokenized partitions with realistic shapes, for the corpus tests and benchmark.

Built with numpy straight into Arrow buffers (no Python list per token), so that tens of millions of
tokens take seconds. Shapes follow real samples: lengths long-tailed between 200 and 8000 tokens, a
prompt with an ``<|im_end|>`` closing each earlier turn, a completion that ends in exactly one
``<|im_end|>`` when the turn finished and none when it was cut off, the mask 1 on the completion, and
API token counts off by a token now and then (cancelling out in the sum).
"""

import numpy as np
import pyarrow as pa

from eagle_assets.corpus.tokenized_schema import ARROW_SCHEMA, EOT_ID

ORDINARY_ID_LIMIT = 163_584  # ids at and above are special tokens
FINISH_REASONS = ("stop", "tool_calls", "length")
FINISH_WEIGHTS = (0.8, 0.12, 0.08)


def synthetic_lengths(rng: np.random.Generator, n: int, low: int = 200, high: int = 8000) -> np.ndarray:
    """Log-normal, median ~1200 tokens, clipped to [low, high]: a few long samples carry many tokens."""
    return np.clip(rng.lognormal(np.log(1200), 0.8, n), low, high).astype(np.int32)


def synthetic_tokenized_table(
    rng: np.random.Generator,
    n: int,
    *,
    dataset: str = "B1",
    shard: str = "00000",
    lengths: np.ndarray | None = None,
    provider: str = "moonshotai",
    id_prefix: str | None = None,
    token_noise: bool = True,
) -> pa.Table:
    """``n`` valid rows of ``ARROW_SCHEMA`` (every validation check passes on them)."""
    n_tokens = (synthetic_lengths(rng, n) if lengths is None else np.asarray(lengths, dtype=np.int32)).astype(np.int64)
    if n and n_tokens.min() < 2:
        raise ValueError("samples need at least 2 tokens (a prompt token and a completion token)")
    finish = rng.choice(len(FINISH_REASONS), size=n, p=FINISH_WEIGHTS)
    ended = finish < 2
    prompt_len = np.maximum(1, (n_tokens * rng.uniform(0.15, 0.6, n)).astype(np.int64))
    prompt_len = np.minimum(prompt_len, n_tokens - 1)
    completion_len = n_tokens - prompt_len
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_tokens, out=offsets[1:])
    total = int(offsets[-1])
    values = rng.integers(0, ORDINARY_ID_LIMIT, size=total, dtype=np.int32)
    # An earlier turn's end in the prompt (before the 3-token assistant header): not counted as the completion's.
    history = prompt_len >= 8
    values[(offsets[:-1] + prompt_len - 4)[history]] = EOT_ID
    values[(offsets[1:] - 1)[ended]] = EOT_ID
    row_of = np.repeat(np.arange(n), n_tokens)
    mask = (np.arange(total) - offsets[:-1][row_of]) >= prompt_len[row_of]
    eot_in_completion = np.zeros(n, dtype=np.int64)
    np.add.at(eot_in_completion, row_of[mask & (values == EOT_ID)], 1)
    noise = np.zeros(n, dtype=np.int64)
    if token_noise:  # ±1 on some samples, cancelling in aggregate (as a sound reconstruction does)
        half = rng.permutation(n)[: 2 * (n // 2)].reshape(2, -1)
        noise[half[0]] = rng.choice([-1, 0, 0, 1], size=half.shape[1])
        noise[half[1]] = -noise[half[0]]
    api = np.maximum(0, completion_len + noise)
    prefix = f"{dataset}-{shard}-" if id_prefix is None else id_prefix
    columns = {
        "prompt_id": pa.array([f"{prefix}{i:08d}" for i in range(n)], pa.string()),
        "dataset": pa.array([dataset] * n, pa.string()),
        "shard": pa.array([shard] * n, pa.string()),
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values)),
        "loss_mask": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(mask.astype(np.uint8))),
        "n_tokens": pa.array(n_tokens.astype(np.int32)),
        "prompt_len": pa.array(prompt_len.astype(np.int32)),
        "completion_len": pa.array(completion_len.astype(np.int32)),
        "api_completion_tokens": pa.array(api.astype(np.int32)),
        "token_diff": pa.array((completion_len - api).astype(np.int32)),
        "finish_reason": pa.array([FINISH_REASONS[f] for f in finish.tolist()], pa.string()),
        "provider": pa.array([provider] * n, pa.string()),
        "ends_with_eot": pa.array(ended),
        "eot_count": pa.array(eot_in_completion.astype(np.int32)),
        "native_completion_tokens": pa.nulls(n, pa.int32()),
    }
    return pa.table(columns).cast(ARROW_SCHEMA)
