"""The KV connector a vLLM engine loads (``kv_connector_module_path``) to hand each prompt's captured states over.

vLLM's ``extract_hidden_states`` method keeps the aux layers' (and the final norm's input) rows of every prompt
token in a cache-only layer; a connector takes them out when the request finishes. vLLM's own
``ExampleHiddenStatesConnector`` does that with pinned memory and CUDA streams, so it dies on a CPU engine
("pin_memory=True requires a CUDA or other accelerator backend"). This one copies the rows to the host on either
device, writes one safetensors file per request under a temporary name and renames it, so the reader
(``extract_vllm``) never sees a partial file and needs no lock. Only tensor-parallel rank 0 writes: after the
all-reduce every rank holds the same rows. It runs inside the engine's processes and imports vLLM at module load.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Copied:
    """What the base class polls for "done sending": the rows are on the host before this is recorded."""

    def query(self) -> bool:
        return True


class StoreHandoffConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` with a synchronous, device-neutral, atomic write."""

    def _submit_async_write(self, pending: Any) -> None:
        if not self._is_tp_rank_zero:
            return
        if self._kv_cache is None:
            raise RuntimeError("hidden-state connector used before vLLM registered its cache layer")
        size = self._block_size
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(size).reshape(1, size) + blocks.reshape(-1, 1) * size).flatten()
        rows = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), pending.token_ids.shape[0])
        tensors = {"hidden_states": rows.to("cpu", copy=True).contiguous(), "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        partial = f"{pending.filename}.partial"
        save_file(tensors, partial)
        os.replace(partial, pending.filename)
        self._req_copy_events[pending.req_id] = _Copied()  # type: ignore[assignment]
