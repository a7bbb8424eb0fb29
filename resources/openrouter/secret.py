"""The API key as a value that cannot be printed by accident."""

import os
import stat
import warnings
from pathlib import Path

from eagle_assets.errors import ConfigError


class MissingApiKeyError(ConfigError, RuntimeError):
    """No key in the configured file nor in the environment variable."""


class ApiKey:
    """Holds the key; ``repr``/``str`` never show it, so logs and tracebacks stay clean."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        value = value.strip()
        if not value:
            raise MissingApiKeyError("the API key is empty")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "ApiKey(****)"

    __str__ = __repr__


def check_key_file_permissions(path: Path) -> str | None:
    """A warning text when group or others can read the key file, else None."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        return f"API key file {path} is readable by other users (mode {stat.S_IMODE(mode):o}); chmod 600 it"
    return None


def load_api_key(key_file: str | None, env_var: str | None) -> ApiKey:
    """The file wins over the environment; the error names where we looked, never a value."""
    if key_file:
        path = Path(key_file).expanduser()
        if path.is_file():
            warning = check_key_file_permissions(path)
            if warning:
                warnings.warn(warning, stacklevel=2)
            text = path.read_text(encoding="utf-8").strip()
            if text:
                return ApiKey(text)
    if env_var and os.environ.get(env_var, "").strip():
        return ApiKey(os.environ[env_var])
    where = " or ".join(x for x in [f"file {key_file}" if key_file else "", f"${env_var}" if env_var else ""] if x)
    raise MissingApiKeyError(f"no OpenRouter API key found (looked in {where or 'nowhere'})")
