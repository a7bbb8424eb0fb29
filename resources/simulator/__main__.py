"""``python -m resources.simulator``: run the OpenRouter simulator as a process of its own.

A separate process is what the benchmark and the Dagster steps need: its CPU is not the client's
and its credit balance outlives any one step. Readiness is one ``SIMULATOR_URL=...`` line on
stdout, so a parent can wait for it without polling.
"""

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson

from eagle_assets.settings import tokenizer_dir
from resources.simulator.config import (
    DEFAULT_PROVIDERS,
    LatencyConfig,
    ProviderEndpoint,
    SimulatorConfig,
    is_loopback_host,
)
from resources.simulator.faults import FaultConfig
from resources.simulator.server import start_server

_DEFAULTS = SimulatorConfig()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m resources.simulator", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="loopback only: 127.x, localhost or ::1")
    p.add_argument("--port", type=int, default=8765, help="0 = an ephemeral port")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--credits", type=float, default=_DEFAULTS.credits, help="initial limit (USD) unless the state file has one"
    )
    p.add_argument("--state-file", type=Path, default=None, help="JSON file keeping the balance across restarts")
    p.add_argument("--key", action="append", default=None, help="accepted API key (repeatable; default: any)")
    p.add_argument("--key-label", default=_DEFAULTS.key_label)
    p.add_argument("--unlimited-key", action="store_true", help="/key answers limit and limit_remaining null")
    p.add_argument(
        "--management-key", action="append", default=None, help="a key /credits answers (repeatable; others: 403)"
    )
    p.add_argument(
        "--workspace-budget", type=float, default=None, help="USD of usage after which requests get 403 (budget)"
    )
    p.add_argument(
        "--leading-space-rate",
        type=float,
        default=_DEFAULTS.leading_space_rate,
        help="share of prompts whose reasoning and content start with a space",
    )
    p.add_argument(
        "--tokenizer-dir", default=None, help="folder or Hub repo id (default: $EAGLE_FORGE_TOKENIZER, else bundled)"
    )
    lat = p.add_mutually_exclusive_group()
    lat.add_argument("--latency-fixed", type=float, metavar="SECONDS")
    lat.add_argument("--latency-lognormal", type=float, nargs=2, metavar=("MEDIAN", "SIGMA"))
    p.add_argument("--latency-min", type=float, default=0.0)
    p.add_argument("--latency-max", type=float, default=120.0)
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a FaultConfig field, e.g. rate_limit=0.05 or stall_seconds=5 (repeatable)",
    )
    p.add_argument("--admit-rate", type=float, default=None, help="token-bucket admissions per second")
    p.add_argument("--admit-burst", type=float, default=None)
    p.add_argument("--admit-no-retry-after", action="store_true", help="admit-rate 429s without Retry-After")
    p.add_argument("--retry-after", type=float, default=None, help="Retry-After seconds of simulated 429s")
    p.add_argument("--stall-seconds", type=float, default=None)
    p.add_argument("--mean-completion-tokens", type=int, default=_DEFAULTS.mean_completion_tokens)
    p.add_argument("--tool-call-probability", type=float, default=_DEFAULTS.tool_call_probability)
    p.add_argument("--generation-404-ms", type=float, default=_DEFAULTS.generation_404_ms)
    p.add_argument(
        "--no-generation-id-header", action="store_true", help="answer without X-Generation-Id, as older responses"
    )
    p.add_argument(
        "--request-wide-400", default=None, metavar="MESSAGE", help="answer every chat request with this 400"
    )
    p.add_argument(
        "--plain-body-at-end",
        action="store_true",
        help="non-streaming answers come whole at the end (no early head, no whitespace padding)",
    )
    p.add_argument("--cache-size", type=int, default=_DEFAULTS.cache_size)
    p.add_argument("--backlog", type=int, default=_DEFAULTS.backlog)
    p.add_argument("--stream-chunks", type=int, default=_DEFAULTS.stream_chunks)
    p.add_argument(
        "--usage-chunk-with-choice-rate",
        type=float,
        default=_DEFAULTS.usage_chunk_with_choice_rate,
        help="share of streams whose usage chunk repeats the finish choice (the rest send choices: [])",
    )
    p.add_argument("--state-flush-interval", type=float, default=_DEFAULTS.state_flush_interval_s)
    p.add_argument(
        "--providers-json", default=None, help="JSON list of ProviderEndpoint objects replacing the defaults"
    )
    p.add_argument(
        "--tiny-target",
        type=Path,
        default=None,
        metavar="DIR",
        help="answer with the greedy output of the tiny target at DIR (built there when --tiny-target-seed is given)",
    )
    p.add_argument(
        "--tiny-target-seed",
        type=int,
        default=None,
        metavar="N",
        help="build the tiny target with seed N (idempotent) at --tiny-target, or at its default place, and use it",
    )
    p.add_argument("--tiny-target-max-batch", type=int, default=_DEFAULTS.tiny_target_max_batch)
    p.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the tiny target's forwards")
    p.add_argument("--no-uvloop", action="store_true")
    return p


def _fault_config(args: argparse.Namespace) -> FaultConfig:
    values: dict[str, Any] = {}
    for item in args.fault:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--fault expects NAME=VALUE, got {item!r}")
        values[name.strip()] = value.strip()
    if args.admit_rate is not None:
        values["admit_rate_per_s"] = args.admit_rate
    if args.admit_burst is not None:
        values["admit_burst"] = args.admit_burst
    if args.admit_no_retry_after:
        values["admit_retry_after"] = False
    if args.retry_after is not None:
        values["retry_after_s"] = args.retry_after
    if args.stall_seconds is not None:
        values["stall_seconds"] = args.stall_seconds
    return FaultConfig.from_mapping(values)


def _providers(raw: str | None) -> tuple[ProviderEndpoint, ...]:
    if raw is None:
        return DEFAULT_PROVIDERS
    items = orjson.loads(raw)
    names = {f.name for f in fields(ProviderEndpoint)}
    return tuple(ProviderEndpoint(**{k: v for k, v in item.items() if k in names}) for item in items)


def config_from_args(argv: Sequence[str] | None = None) -> SimulatorConfig:
    return config_from_namespace(build_parser().parse_args(argv))


def _tiny_target_dir(args: argparse.Namespace) -> Path | None:
    if args.tiny_target is None and args.tiny_target_seed is None:
        return None
    if args.tiny_target_seed is None:
        return args.tiny_target
    from eagle_assets.target.tiny import build_tiny_target, default_tiny_target_dir  # imports torch

    seed = args.tiny_target_seed
    return build_tiny_target(args.tiny_target or default_tiny_target_dir(seed), seed)


def config_from_namespace(args: argparse.Namespace) -> SimulatorConfig:
    if not is_loopback_host(args.host):
        raise SystemExit(f"refusing to listen on {args.host!r}: the simulator binds loopback only")
    if args.latency_fixed is not None:
        latency = LatencyConfig.fixed(args.latency_fixed)
    elif args.latency_lognormal is not None:
        median, sigma = args.latency_lognormal
        latency = LatencyConfig.lognormal(median, sigma, args.latency_min, args.latency_max)
    else:
        latency = LatencyConfig()
    try:
        faults = _fault_config(args)
    except ValueError as exc:
        raise SystemExit(f"bad fault setting: {exc}") from None
    return SimulatorConfig(
        host=args.host,
        port=args.port,
        seed=args.seed,
        credits=args.credits,
        state_file=args.state_file,
        accepted_keys=frozenset(args.key) if args.key else None,
        key_label=args.key_label,
        unlimited_key=args.unlimited_key,
        management_keys=frozenset(args.management_key or ()),
        workspace_budget_usd=args.workspace_budget,
        leading_space_rate=args.leading_space_rate,
        tokenizer_dir=tokenizer_dir(args.tokenizer_dir),
        providers=_providers(args.providers_json),
        latency=latency,
        faults=faults,
        mean_completion_tokens=args.mean_completion_tokens,
        tool_call_probability=args.tool_call_probability,
        generation_404_ms=args.generation_404_ms,
        generation_id_header=not args.no_generation_id_header,
        plain_head_first=not args.plain_body_at_end,
        request_wide_400=args.request_wide_400,
        cache_size=args.cache_size,
        backlog=args.backlog,
        stream_chunks=args.stream_chunks,
        usage_chunk_with_choice_rate=args.usage_chunk_with_choice_rate,
        state_flush_interval_s=args.state_flush_interval,
        tiny_target_dir=_tiny_target_dir(args),
        tiny_target_max_batch=args.tiny_target_max_batch,
    )


async def serve(config: SimulatorConfig) -> None:
    """Serve until SIGTERM/SIGINT, then stop cleanly so the state file has the final balance."""
    server = await start_server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"SIMULATOR_URL={server.base_url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_namespace(args)
    if config.tiny_target_dir is not None:
        import torch

        torch.set_num_threads(max(1, args.torch_threads))  # this process only: its CPU is shared with the client
    loop_factory = None
    if not args.no_uvloop:
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
