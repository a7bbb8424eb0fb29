"""``python -m resources.simulator``: run the OpenRouter simulator as a process of its own.

Its CPU is not the client's and its credit balance outlives any one step. Readiness is one
``SIMULATOR_URL=...`` line on stdout, so a parent can wait for it without polling.
"""

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from resources.simulator.config import SimulatorConfig, is_loopback_host
from resources.simulator.flags import add_flags, settings_from_namespace
from resources.simulator.server import start_server


def build_parser() -> argparse.ArgumentParser:
    """The settings' flags (derived from ``SimulatorConfig``) and the options of this process alone."""
    p = argparse.ArgumentParser(prog="python -m resources.simulator", description=__doc__.splitlines()[0])
    add_flags(p, SimulatorConfig)
    p.add_argument(
        "--tiny-target-seed",
        type=int,
        default=None,
        metavar="N",
        help="build the tiny target with seed N (idempotent) at --tiny-target, or at its default place, and use it",
    )
    p.add_argument(
        "--tiny-target-kind",
        default="llama-tiny",
        choices=["llama-tiny", "kimi-k25-tiny"],
        help="which tiny target --tiny-target-seed builds (eagle_assets.target.tiny_targets)",
    )
    p.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the tiny target's forwards")
    p.add_argument("--no-uvloop", action="store_true")
    return p


def config_from_args(argv: Sequence[str] | None = None) -> SimulatorConfig:
    return config_from_namespace(build_parser().parse_args(argv))


def _tiny_target_dir(given: Path | None, seed: int | None, kind: str = "llama-tiny") -> Path | None:
    if seed is None:
        return given
    from eagle_assets.target.tiny_targets import build_named_tiny_target, tiny_target_path  # builders import torch

    return build_named_tiny_target(kind, given or tiny_target_path(kind, seed), seed)


def config_from_namespace(args: argparse.Namespace) -> SimulatorConfig:
    host = getattr(args, "host", None)
    if host is not None and not is_loopback_host(host):
        raise SystemExit(f"refusing to listen on {host!r}: the simulator binds loopback only")
    try:
        settings = settings_from_namespace(args, SimulatorConfig)
    except ValueError as exc:  # a fault or latency setting its class refuses
        raise SystemExit(str(exc)) from None
    if args.tiny_target_seed is not None:
        settings["tiny_target_dir"] = _tiny_target_dir(
            settings.get("tiny_target_dir"), args.tiny_target_seed, args.tiny_target_kind
        )
    return SimulatorConfig(**settings)


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
