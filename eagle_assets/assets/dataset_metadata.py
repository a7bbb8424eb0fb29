"""What a generation partition shows about its data in the UI: source and commit, format, rows, rejects, mode."""

import dagster as dg

from eagle_assets.generation.partition_inputs import PartitionInputs
from eagle_assets.markdown import table

MAX_PROBLEMS_SHOWN = 20


def input_metadata(inputs: PartitionInputs) -> dict[str, dg.MetadataValue]:
    src, scan, shard = inputs.source, inputs.scan, inputs.shard
    rejected = [(reason, f"{n:,}") for reason, n in sorted(scan.rejected.items(), key=lambda kv: -kv[1])]
    meta: dict[str, dg.MetadataValue] = {
        "source": dg.MetadataValue.text(src.description),
        "format": dg.MetadataValue.text(inputs.format.describe()),
        "regenerate": dg.MetadataValue.text(inputs.mode),
        "rows_in_source": dg.MetadataValue.int(scan.rows),
        "usable_rows_in_source": dg.MetadataValue.int(scan.usable),
        "rows_rejected_in_source": dg.MetadataValue.md(table(("reason", "rows"), rejected) if rejected else "none"),
        "repeated_id_rows_in_source": dg.MetadataValue.text(scan.duplicates_text()),
        "rows_in_shard": dg.MetadataValue.int(shard.rows),
        "rows_rejected_in_shard": dg.MetadataValue.int(len(shard.problems)),
        "requests_in_shard": dg.MetadataValue.int(inputs.requests),
        "turns_per_row": dg.MetadataValue.md(
            table(("turns", "rows"), [(k, f"{v:,}") for k, v in inputs.turns_per_row().items()])
        ),
        "malformed_rows_in_file": dg.MetadataValue.int(scan.bad),
    }
    if src.commit:
        meta["source_commit"] = dg.MetadataValue.text(src.commit)
        meta["source_split"] = dg.MetadataValue.text(f"{src.split}" + (f" (config {src.config})" if src.config else ""))
    if shard.problems:
        meta["first_rejected_rows"] = dg.MetadataValue.md(
            "\n".join(f"- {p}" for p in shard.problems[:MAX_PROBLEMS_SHOWN])
        )
    return meta
