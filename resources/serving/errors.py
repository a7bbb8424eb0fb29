"""What can go wrong between the benchmark and a serving engine, each with a message that says what to do."""

from eagle_assets.errors import EngineError


class ServingError(EngineError, RuntimeError):
    """Base of the serving-engine failures."""


class ServerStartError(ServingError):
    """The server exited, or never became healthy, before the benchmark could start; carries its log tail."""


class ServerDiedError(ServingError):
    """The server stopped answering in the middle of a run (connection refused or torn)."""


class EngineResponseError(ServingError):
    """The server answered, but not in the shape this client follows (or with an error body)."""


class SpeculationMissing(ServingError):
    """The server does not speculate (no verification counts), or not with the settings the benchmark asked for."""
