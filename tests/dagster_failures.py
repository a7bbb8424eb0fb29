"""What a failed materialization says: the step's error and every error that raised it, as a test reads them."""

import dagster as dg


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    """The one failed step's error messages, outermost first, one per line."""
    (failure,) = result.get_step_failure_events()
    error, parts = failure.step_failure_data.error, []
    while error is not None:
        parts.append(error.message)
        error = error.cause
    return "\n".join(parts)
