"""Where the latest generation plan is kept, so that every generation step reads the same decision.

A JSON file beside the ledger (``state/generation_plan.json``), replaced atomically: a step never
reads half a plan. Generation steps run in their own processes and may start long after the plan
was made, so the decision travels through this file, not through Dagster's IO.
"""

import json
from pathlib import Path
from typing import Any

from eagle_assets.durable_files import atomic_write_bytes
from eagle_assets.layout import plan_path


def write_plan(doc: dict[str, Any]) -> Path:
    path = plan_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    return path


def read_plan() -> dict[str, Any] | None:
    """The recorded plan, or None if there is none. A file that cannot be read as a plan is an error."""
    path = plan_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a readable generation plan ({exc}); re-materialize generation_plan") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path} is not a generation plan; re-materialize generation_plan")
    return doc
