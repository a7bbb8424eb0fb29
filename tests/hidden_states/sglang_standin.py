"""An SGLang engine stand-in that answers ``generate`` in SGLang's shapes, computed by a real HF model.

Hidden states: ``meta_info["hidden_states"][0]`` holds one row per prompt token as nested lists; with an EAGLE-3
capture draft the rows are the aux layers, captured as SGLang's ``set_eagle3_layers_to_capture`` does (the draft
config's explicit ids + 1 = the decoder layers whose *input* is taken), else the final norm's output.

Log-probabilities (sgl-project/sglang 001067ff, see ``eagle_assets/hidden_states/calibration_sglang.py``): with
``return_logprob`` and ``logprob_start_len=0``, ``meta_info["input_token_logprobs"]`` has one
``(logprob, token_id, None)`` per input token, entry i being log P(ids[i] | ids[:i]) and entry 0's logprob None;
``input_top_logprobs`` has per token a list of ``top_logprobs_num`` such tuples (None at entry 0). The values are
the model's own log-softmax, after SGLang's temperature scaling (``temp_scaled_logprobs``) for a temperature != 1.

``last_layer`` makes a misconfigured engine: its "last" rows are HF ``hidden_states[last_layer]`` instead of the
final state its head reads, while its log-probabilities stay the model's own.
"""

import json
from pathlib import Path

import torch


class FakeSGLangEngine:
    def __init__(self, model, engine_kwargs, dtype=torch.float32, last_layer: int | None = None):
        self.model, self.kwargs, self.dtype, self.last_layer = model, engine_kwargs, dtype, last_layer
        assert engine_kwargs["enable_return_hidden_states"] and engine_kwargs["disable_radix_cache"]
        self.capture = None
        draft = engine_kwargs.get("speculative_draft_model_path")
        if draft:
            ids = json.loads(Path(draft, "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
            self.capture = [i + 1 for i in ids]  # SGLang: "we plus 1 here"
        self.prompts = 0
        self.logprob_requests = 0
        self.shut = False

    @torch.inference_mode()
    def generate(
        self,
        input_ids,
        sampling_params,
        return_hidden_states=False,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
    ):
        assert sampling_params["max_new_tokens"] == 1
        if return_logprob:
            assert logprob_start_len == 0, "the stand-in answers whole-input log-probs only"
            self.logprob_requests += 1
        out = []
        for ids in input_ids:
            self.prompts += 1
            o = self.model(torch.tensor([ids]), output_hidden_states=True)
            meta = {
                "id": f"req{self.prompts}",
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "finish_reason": {"type": "length", "length": 1},
            }
            if return_hidden_states:
                meta["hidden_states"] = [self._rows(o.hidden_states).to(self.dtype).tolist()]
            if return_logprob:
                temperature = float(sampling_params.get("temperature", 1.0)) or 1.0
                lsm = torch.log_softmax(o.logits[0].float() / temperature, dim=-1)
                meta["input_token_logprobs"] = [(None, int(ids[0]), None)] + [
                    (float(lsm[t - 1, ids[t]]), int(ids[t]), None) for t in range(1, len(ids))
                ]
                if top_logprobs_num > 0:
                    val, idx = lsm[:-1].topk(top_logprobs_num, dim=-1)
                    meta["input_top_logprobs"] = [None] + [
                        [(float(v), int(i), None) for v, i in zip(vs, js, strict=True)]
                        for vs, js in zip(val.tolist(), idx.tolist(), strict=True)
                    ]
            out.append({"output_ids": [int(o.logits[0, -1].argmax())], "meta_info": meta})
        return out

    def _rows(self, hs):
        if self.capture:  # input of decoder layer i == HF hidden_states[i]
            return torch.cat([hs[i][0] for i in self.capture], -1)
        return hs[self.last_layer if self.last_layer is not None else -1][0]

    def shutdown(self):
        self.shut = True
