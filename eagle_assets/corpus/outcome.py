"""A check's outcome, apart from the DuckDB checks that produce most of them.

Its own module so that the hidden-state fidelity checks, which run on the GPU host, can return one without
importing DuckDB (``validation.py``), which that host does not need for anything else.
"""

from dataclasses import dataclass, field
from typing import Any

MetadataValue = float | int | str


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    name: str
    passed: bool
    summary: str
    metadata: dict[str, MetadataValue] = field(default_factory=dict)
    failing_examples: list[dict[str, Any]] = field(default_factory=list)
