"""How the vLLM engines are sized and set up on a CPU machine, without starting one (no vLLM needed).

What these numbers guard against was seen on the real engine: a prompt exactly as long as ``max_model_len`` is
refused ("plus the number of requested output tokens (at least 1) is longer than the maximum model length"), the
default KV cache got a tensor-parallel worker OOM-killed, and at tp > 1 vLLM named its workers' queue by this
host's network address.
"""

import logging
import os

import pytest

from resources.serving.vllm_engine import (
    TokenizerlessWarmup,
    cpu_engine_environment,
    seq_len_for,
    with_cpu_native_ops,
)


def test_the_engine_has_room_for_the_longest_row_and_the_token_it_generates():
    assert seq_len_for([255]) == 256
    assert seq_len_for([256]) == 512  # vLLM refuses a prompt as long as max_model_len
    assert seq_len_for([10, 511, 3]) == 512
    assert seq_len_for([512], multiple=512) == 1024
    assert seq_len_for(iter([1])) == 256
    with pytest.raises(ValueError, match="no rows"):
        seq_len_for([])


def test_a_cpu_engine_gets_a_small_kv_cache_loopback_and_one_core_share_per_rank():
    one = cpu_engine_environment(1, {})
    assert one == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}
    if len(os.sched_getaffinity(0)) >= 2:
        two = cpu_engine_environment(2, {})
        cores = sorted(os.sched_getaffinity(0))
        share = len(cores) // 2
        assert two["VLLM_CPU_OMP_THREADS_BIND"].split("|") == [
            ",".join(map(str, cores[:share])),
            ",".join(map(str, cores[share : 2 * share])),
        ]
    # what the environment sets wins
    mine = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_HOST_IP": "10.0.0.7", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    assert cpu_engine_environment(2, mine) == {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_HOST_IP": "10.0.0.7"}


def test_a_cpu_engine_runs_the_rotation_in_pytorch_unless_the_caller_chose():
    """vLLM's CPU rotary kernel is wrong on MLA's 3-D queries (``test_extract_vllm_mla`` holds the real engine to it);
    a caller's own compilation settings are kept, and an op the caller names stays as named."""
    assert with_cpu_native_ops({"model": "m"}) == {
        "model": "m",
        "compilation_config": {"custom_ops": ["-rotary_embedding"]},
    }
    mine = {"compilation_config": {"custom_ops": ["+rms_norm"], "mode": 0}}
    out = with_cpu_native_ops(mine)
    assert out["compilation_config"] == {"custom_ops": ["+rms_norm", "-rotary_embedding"], "mode": 0}
    assert mine == {"compilation_config": {"custom_ops": ["+rms_norm"], "mode": 0}}  # the caller's left as it was
    forced = {"compilation_config": {"custom_ops": ["+rotary_embedding"]}}
    assert with_cpu_native_ops(forced)["compilation_config"]["custom_ops"] == ["+rotary_embedding"]


def test_more_ranks_than_cores_is_refused_by_name():
    from eagle_assets.errors import ConfigError

    with pytest.raises(ConfigError, match="tensor_parallel_size 4096 needs as many cores"):
        cpu_engine_environment(4096, {})


def _warmup_record(error: Exception, message: str = "Chat template warmup failed") -> logging.LogRecord:
    try:
        raise error
    except Exception as exc:
        info = (type(exc), exc, exc.__traceback__)
    return logging.LogRecord("vllm.renderers.base", logging.WARNING, "base.py", 380, message, (), info)


def test_only_the_warmup_that_has_no_tokenizer_is_kept_out_of_the_engines_log():
    """vLLM's own words when ``skip_tokenizer_init`` leaves its chat-template warm-up nothing to render with."""
    quiet = TokenizerlessWarmup()
    assert not quiet.filter(_warmup_record(ValueError("Tokenizer not available when `skip_tokenizer_init=True`")))
    assert quiet.filter(_warmup_record(RuntimeError("template syntax error")))  # any other failure is logged
    assert quiet.filter(_warmup_record(ValueError("skip_tokenizer_init"), message="Something else failed"))
    assert quiet.filter(logging.LogRecord("vllm", logging.INFO, "x.py", 1, "Chat template warmup failed", (), None))
