"""The embedded default, end to end: ``python -m eagle_assets.demo``.

No key and no GPU: the OpenRouter resource points at the bundled simulator on 127.0.0.1. Every
partition is materialized into the persistent Dagster instance under ``$EAGLE_FORGE_HOME``, so
``dagster dev -w workspace.yaml`` afterwards shows the same runs, partitions and metadata.
"""

import argparse
import sys
import time

import dagster as dg

from eagle_assets import settings
from eagle_assets.instance import ensure_dagster_home

QUIET = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--datasets", nargs="*", help="only these datasets (default: all)")
    args = parser.parse_args(argv)
    home = ensure_dagster_home()
    from eagle_assets import definitions  # after DAGSTER_HOME is set

    instance = dg.DagsterInstance.get()
    resources = {"openrouter": definitions.defs.resources["openrouter"]}
    start = time.monotonic()
    failed: list[str] = []
    for name, spec in definitions.DATASETS.items():
        if args.datasets and name not in args.datasets:
            continue
        asset_def = definitions.defs.get_assets_def(dg.AssetKey(["generated", name]))
        done = instance.get_materialized_partitions(asset_def.key)
        for shard in spec.shard_keys():
            if shard in done:
                print(f"  {name}/{shard}: already materialized")
                continue
            result = dg.materialize(
                [asset_def],
                partition_key=shard,
                instance=instance,
                resources=resources,
                raise_on_error=False,
                run_config=QUIET,
            )
            status = "ok" if result.success else "FAILED"
            print(f"  {name}/{shard}: {status}", flush=True)
            if not result.success:
                failed.append(f"{name}/{shard}")
    print(f"\nfinished in {time.monotonic() - start:.1f}s; {len(failed)} failed partitions {failed or ''}")
    print(f"generated Parquet: {settings.generated_dir()}")
    print(
        f"OpenRouter simulator still serving at {resources['openrouter'].base_url} (log: "
        f"{settings.forge_home() / 'simulator' / 'simulator.log'}); `pkill -f resources.simulator` stops it"
    )
    print(
        f"Dagster instance:  {home}   (browse it: DAGSTER_HOME={home} dagster dev -w workspace.yaml"
        " → http://127.0.0.1:3000)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
