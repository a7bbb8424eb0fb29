"""The simulator's settings are declared once, on the dataclasses: the parser and ``config_to_args`` are derived.

The round trip config -> flags -> config must be exact for every setting, nested latency and fault settings
included: a child process serves by what its parent meant. The strategies below name every field, so a new
setting fails ``test_every_setting_has_a_strategy`` until it is part of the round trip.
"""

import argparse
import dataclasses
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle_assets.settings import Settings
from eagle_assets.tokenization.tokenizer_source import BUNDLED_DIR
from resources.simulator.__main__ import build_parser, config_from_args
from resources.simulator.config import (
    DEFAULT_PORT,
    DEFAULT_PROVIDERS,
    LatencyConfig,
    ProviderEndpoint,
    SimulatorConfig,
    config_to_args,
)
from resources.simulator.faults import FAULT_NAMES, FaultConfig
from resources.simulator.flags import Alias, add_flags, flag, flags_of, group, settings_from_namespace

# any text: empty, "-x" (read as a flag unless written --flag=-x), "a=b", unicode; not "--", which Python 3.11's
# argparse cannot take as a value (refused: test_a_double_dash_value_is_refused_not_lost)
TEXT = st.text(max_size=12).filter(lambda s: s != "--")
FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
NON_NEGATIVE = st.floats(min_value=0.0, max_value=1e9, allow_nan=False)
SHARE = st.floats(min_value=0.0, max_value=1.0)
PATHS = st.text(alphabet=string.ascii_letters + "-_. ", min_size=1, max_size=10).map(lambda s: Path("/tmp/sim") / s)
KEYS = st.frozensets(TEXT, max_size=4)

PROVIDER = st.builds(
    ProviderEndpoint,
    name=TEXT,
    slug=TEXT,
    quantization=st.none() | TEXT,
    prompt_usd_per_m=NON_NEGATIVE,
    completion_usd_per_m=NON_NEGATIVE,
    context_length=st.integers(1, 2**40),
    max_completion_tokens=st.integers(1, 2**40),
    status=st.integers(-10, 0),
    uptime_last_30m=SHARE,
    endpoint_tag=TEXT,
    supported_parameters=st.none() | st.lists(TEXT, max_size=4).map(tuple),
)

LATENCY: dict[str, st.SearchStrategy[Any]] = {
    "fixed_s": st.none() | NON_NEGATIVE,
    "median_s": st.none() | st.floats(min_value=1e-6, max_value=1e6),
    "sigma": NON_NEGATIVE,
    "min_s": FINITE,
    "max_s": FINITE,
}
FAULTS: dict[str, st.SearchStrategy[Any]] = {
    **{name: st.floats(min_value=0.0, max_value=1.0 / len(FAULT_NAMES)) for name in FAULT_NAMES},
    "retry_after_s": NON_NEGATIVE,
    "stall_seconds": NON_NEGATIVE,
    "admit_rate_per_s": st.none() | st.floats(min_value=1e-6, max_value=1e9),
    "admit_burst": st.none() | FINITE,
    "admit_retry_after": st.booleans(),
    "bill_truncated_json": st.booleans(),
}
SETTINGS: dict[str, st.SearchStrategy[Any]] = {
    "host": st.sampled_from(["127.0.0.1", "127.3.2.1", "localhost", "::1"]),
    "port": st.integers(0, 65535),
    "seed": st.integers(-(2**63), 2**63),
    "credits": FINITE,
    "state_file": st.none() | PATHS,
    "accepted_keys": st.none() | st.frozensets(TEXT, min_size=1, max_size=4),
    "unlimited_key": st.booleans(),
    "management_keys": KEYS,
    "workspace_budget_usd": st.none() | FINITE,
    "leading_space_rate": SHARE,
    "key_label": TEXT,
    "tokenizer_dir": st.sampled_from([BUNDLED_DIR, Path(__file__).resolve().parent]),
    "model_slug": TEXT,
    "model_permaslug": TEXT,
    "providers": st.just(DEFAULT_PROVIDERS) | st.lists(PROVIDER, min_size=1, max_size=3).map(tuple),
    "latency": st.fixed_dictionaries(LATENCY)
    .filter(lambda d: d["fixed_s"] is None or d["median_s"] is None)
    .map(lambda d: LatencyConfig(**d)),
    "faults": st.fixed_dictionaries(FAULTS).map(lambda d: FaultConfig(**d)),
    "mean_completion_tokens": st.integers(1, 10**6),
    "tool_call_probability": SHARE,
    "generation_404_ms": NON_NEGATIVE,
    "generation_id_header": st.booleans(),
    "plain_head_first": st.booleans(),
    "request_wide_400": st.none() | TEXT,
    "request_wide_400_delay_s": NON_NEGATIVE,
    "cache_size": st.integers(0, 10**7),
    "max_generations_kept": st.integers(0, 10**7),
    "backlog": st.integers(0, 10**5),
    "state_flush_interval_s": NON_NEGATIVE,
    "stream_chunks": st.integers(1, 1000),
    "usage_chunk_with_choice_rate": SHARE,
    "processing_comment_interval_s": st.floats(min_value=1e-3, max_value=60.0),
    "tiny_target_dir": st.none() | PATHS,
    "tiny_target_max_batch": st.integers(1, 1024),
}


def round_trip(config: SimulatorConfig) -> SimulatorConfig:
    return config_from_args(config_to_args(config))


def test_every_setting_has_a_strategy() -> None:
    assert set(SETTINGS) == {f.name for f in dataclasses.fields(SimulatorConfig)}
    assert set(LATENCY) == {f.name for f in dataclasses.fields(LatencyConfig)}
    assert set(FAULTS) == {f.name for f in dataclasses.fields(FaultConfig)}


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries(SETTINGS))
def test_any_config_round_trips_through_its_flags(values: dict[str, Any]) -> None:
    config = SimulatorConfig(**values)
    assert round_trip(config) == config


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(SETTINGS)).flatmap(lambda name: st.tuples(st.just(name), SETTINGS[name])))
def test_each_setting_alone_round_trips(change: tuple[str, Any]) -> None:
    name, value = change
    config = SimulatorConfig(**{name: value})
    flags = config_to_args(config)
    assert round_trip(config) == config
    if name != "port":
        assert (flags != ["--port", "0"]) == (value != getattr(SimulatorConfig(), name))  # only what differs


def test_defaults_need_no_flags_but_the_port() -> None:
    assert config_to_args(SimulatorConfig()) == ["--port", "0"]  # a test config takes any free port
    assert config_to_args(SimulatorConfig(port=DEFAULT_PORT)) == []
    assert round_trip(SimulatorConfig()) == SimulatorConfig()


def test_one_default_port() -> None:
    # A process listens where the Dagster resource looks for the embedded simulator; a config in a test on any port.
    assert config_from_args([]).port == DEFAULT_PORT == Settings.model_fields["sim_port"].default
    assert SimulatorConfig().port == 0


def test_values_that_look_like_flags_are_kept_whole() -> None:
    config = SimulatorConfig(key_label="-x", accepted_keys=frozenset({"--k", "k"}), request_wide_400="--bad")
    flags = config_to_args(config)
    assert "--key-label=-x" in flags and "--key=--k" in flags and "--request-wide-400=--bad" in flags
    assert round_trip(config) == config


def test_a_double_dash_value_is_refused_not_lost() -> None:
    # Python 3.11's argparse reads ``--model-permaslug=--`` as [] (hypothesis found it): refused when written.
    with pytest.raises(ValueError, match="--model-permaslug: the value '--'"):
        config_to_args(SimulatorConfig(model_permaslug="--"))
    assert round_trip(SimulatorConfig(model_permaslug="---")).model_permaslug == "---"


def test_an_empty_key_set_has_no_flags() -> None:
    # None accepts any key; an empty set accepts none, which no flag can say.
    with pytest.raises(ValueError, match="accepted_keys"):
        config_to_args(SimulatorConfig(accepted_keys=frozenset()))


def test_shorthand_flags_and_their_precedence() -> None:
    cfg = config_from_args(["--fault", "stall_seconds=3", "--stall-seconds", "5", "--admit-no-retry-after"])
    assert cfg.faults.stall_seconds == 5 and cfg.faults.admit_retry_after is False
    cfg = config_from_args(["--latency-lognormal", "0.4", "0.5", "--latency-max", "3"])
    assert cfg.latency == LatencyConfig.lognormal(0.4, 0.5, 0.0, 3.0)
    with pytest.raises(SystemExit, match="latency"):
        config_from_args(["--latency-fixed", "1", "--latency-lognormal", "0.4", "0.5"])
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        config_from_args(["--fault", "rate_limit"])
    with pytest.raises(SystemExit, match="unknown fault setting"):
        config_from_args(["--fault", "rate_limt=0.1"])


def test_help_lists_every_setting() -> None:
    text = build_parser().format_help()
    for option in ("--processing-comment-interval", "--latency-lognormal MEDIAN SIGMA", "--admit-rate", "--fault"):
        assert option in text
    assert "(default: 0.25)" in text  # leading_space_rate, from the field


# --- the derivation itself, on settings of its own ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Inner:
    a: float = dataclasses.field(default=1.0, metadata=flag("--inner-a"))
    b: float = 2.0

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "Inner":
        return cls(**{k: float(v) for k, v in values.items()})


@dataclasses.dataclass(frozen=True)
class Outer:
    port: int = dataclasses.field(default=0, metadata=flag(cli_default=80))
    names: frozenset[str] | None = None
    quiet: bool = True
    inner: Inner = dataclasses.field(
        default_factory=Inner, metadata=group("--inner", aliases=(Alias("--both", ("a", "b")),))
    )


def parse(argv: list[str]) -> Outer:
    parser = argparse.ArgumentParser()
    add_flags(parser, Outer)
    return Outer(**settings_from_namespace(parser.parse_args(argv), Outer))


def test_derived_flags_on_a_settings_class_of_their_own() -> None:
    assert parse([]) == Outer(port=80)  # the command line's default, not the field's
    assert flags_of(Outer()) == ["--port", "0"]
    config = Outer(port=80, names=frozenset({"x"}), quiet=False, inner=Inner(3.0, 4.0))
    assert flags_of(config) == ["--names", "x", "--quiet", "--inner-a", "3.0", "--inner", "b=4.0"]
    assert parse(flags_of(config)) == config
    assert parse(["--both", "5", "6", "--inner-a", "7"]).inner == Inner(7.0, 6.0)  # own flags win over aliases


def test_a_setting_the_derivation_cannot_spell_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Odd:
        pairs: dict[str, int] = dataclasses.field(default_factory=dict)

    with pytest.raises(TypeError, match="parse="):
        add_flags(argparse.ArgumentParser(), Odd)

    @dataclasses.dataclass(frozen=True)
    class Unreachable:
        inner: Inner = dataclasses.field(default_factory=Inner, metadata=group())

    with pytest.raises(TypeError, match=r"inner\.b has no flag"):
        add_flags(argparse.ArgumentParser(), Unreachable)
