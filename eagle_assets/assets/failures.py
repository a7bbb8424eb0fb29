"""Where a project error becomes a Dagster failure, and whether Dagster may retry it: here, and only here.

Every asset that stops on purpose raises ``fail(...)``, and every asset that turns a project error
(``eagle_assets.errors``) into a failure does so inside ``project_errors_fail()``, so that "is this retryable?"
is decided in one place instead of by an ``allow_retries=`` argument remembered (or forgotten) at each ``raise``.

The rule: a project error, a budget stop and an asset's own refusal are final for the run (``allow_retries=False``):
a retry would meet the same refusal, and for generation could spend money again before meeting it. ``Resumable``
errors (a lost lease) pass untouched, so a rerun continues; errors not the project's (bugs, the environment) are
not touched either, and a RetryPolicy may retry them.
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import dagster as dg

from eagle_assets.errors import EagleForgeError, Resumable


def fail(description: str, metadata: Mapping[str, Any] | None = None) -> dg.Failure:
    """The failure an asset raises: final, so that no RetryPolicy repeats a refusal (or a purchase)."""
    return dg.Failure(description=description, metadata=metadata, allow_retries=False)


@contextmanager
def project_errors_fail(prefix: str = "") -> Iterator[None]:
    """Turn a project error raised in the block into a final ``dg.Failure`` (chained to it, so its class and
    traceback stay in the run's logs); let ``Resumable`` errors and everything else through unchanged."""
    try:
        yield
    except Resumable:
        raise
    except EagleForgeError as exc:
        raise fail(f"{prefix}{exc}") from exc
