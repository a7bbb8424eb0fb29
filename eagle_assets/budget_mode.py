"""The budget modes, named once for the resource's configuration and admission's maths: the resource may not
import ``eagle_assets.generation``, so the names live here, beside neither."""

from typing import Literal, get_args

from eagle_assets.errors import ConfigError

# statistical: the requests in flight hold n·μ + z·σ·√n of the budget; hard: each holds its worst case.
BudgetMode = Literal["statistical", "hard"]
BUDGET_MODES: tuple[BudgetMode, ...] = get_args(BudgetMode)


class BudgetModeError(ConfigError, ValueError):
    """A budget mode that is neither of ``BUDGET_MODES`` (``EAGLE_FORGE_BUDGET_MODE``, say)."""


def parse_budget_mode(value: str) -> BudgetMode:
    """``value`` (an environment variable, say) as a budget mode, in any case and trimmed."""
    for mode in BUDGET_MODES:
        if mode == value.strip().lower():
            return mode
    raise BudgetModeError(f"budget mode must be one of {', '.join(BUDGET_MODES)}, not {value!r}")
