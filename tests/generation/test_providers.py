"""The provider policy against a real-shaped /endpoints listing: which endpoints may serve, how
requests are pinned to them, what is priced, and the names the data check accepts."""

import json
from pathlib import Path

import orjson
import pytest

from eagle_assets.corpus import validation as v
from resources.openrouter.providers import (
    Endpoint,
    NoAllowedProviderError,
    ProviderPolicy,
    ProviderTable,
    parse_endpoints,
)
from tests.corpus.helpers import generated_row, write_generated

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openrouter"
CASE = json.loads((FIXTURES / "cases.json").read_text())["endpoints"]
ENDPOINTS = parse_endpoints(orjson.loads((FIXTURES / CASE["file"]).read_bytes()))
SETTINGS = v.DuckDBSettings(memory_limit="256MB", threads=1, max_examples=3)


def reason(table: ProviderTable, tag: str) -> str:
    return next(table.reasons[i] for i, e in enumerate(table.endpoints) if e.tag == tag)


def test_listing_parses_null_quantization_bare_tags_and_status():
    by_tag = {e.tag: e for e in ENDPOINTS}
    assert by_tag["novita"].quantization is None and by_tag["novita"].quant == "unknown"
    assert by_tag["fireworks/fast"].slug == "fireworks" and by_tag["fireworks"].slug == "fireworks"
    assert by_tag["together/fp8"].status == -5 and not by_tag["together/fp8"].serving
    assert by_tag["siliconflow/int4"].supported_parameters is not None
    assert "top_p" not in by_tag["siliconflow/int4"].supported_parameters
    assert by_tag["baseten/fp4"].provider_name == "BaseTen"


def test_default_policy_pins_the_allowed_endpoints_by_tag():
    table = ProviderTable(ENDPOINTS, ProviderPolicy())
    assert sorted(e.tag for e in table.allowed) == CASE["allowed_tags"]
    route = table.routing()
    assert route["only"] == CASE["allowed_tags"]  # deepinfra/fp8 pinned apart from deepinfra/fp4
    assert route["require_parameters"] is True and route["allow_fallbacks"] is True
    assert "unknown" not in route["quantizations"]
    assert {"fireworks", "baseten", *CASE["excluded_providers"]} <= set(route["ignore"])
    assert "deepinfra" not in route["ignore"]  # ignoring the slug would drop the pinned fp8 endpoint too
    assert reason(table, "deepinfra/fp8").startswith("yes, pinned")
    assert reason(table, "deepinfra/fp4").startswith("NO: quantization fp4")


def test_a_provider_whose_allowed_endpoint_cannot_be_pinned_is_excluded_and_says_so():
    table = ProviderTable(ENDPOINTS, ProviderPolicy())
    # GMICloud's fp8 endpoint has the bare tag "gmicloud", which would also let its fp4 endpoint in.
    assert table.excluded_providers == CASE["excluded_providers"]
    assert "GMICloud also lists gmicloud/fp4 (fp4)" in reason(table, "gmicloud")
    assert not table.is_allowed_name("GMICloud")
    assert "GMICloud also lists" in table.render()


def test_negative_status_is_neither_allowed_nor_priced():
    down = Endpoint("Together", "together/fp8", "fp8", 9e-6, 90e-6, None, -5)
    table = ProviderTable([*ENDPOINTS, down], ProviderPolicy())
    assert all(e.serving for e in table.allowed)
    assert reason(table, "together/fp8").startswith("NO: status -5")
    assert table.max_completion_price * 1e6 == pytest.approx(CASE["max_completion_usd_per_m"])
    # A response naming an unknown provider is priced at the dearest *serving* endpoint, not the down one.
    assert table.price_of("Somebody")[1] * 1e6 == pytest.approx(2.8)
    assert table.price_of("Together")[1] * 1e6 == pytest.approx(2.8)
    assert "together/fp8" not in table.routing()["only"]


def test_unknown_quantization_is_refused_with_the_way_to_trust_it():
    table = ProviderTable(ENDPOINTS, ProviderPolicy())
    assert "trust_unknown_quantization: [novita]" in reason(table, "novita")
    assert "trust_unknown_quantization: [atlas-cloud]" in reason(table, "atlas-cloud/unknown")
    only_unknown = [e for e in ENDPOINTS if e.quant == "unknown"]
    with pytest.raises(NoAllowedProviderError, match=r"trust_unknown_quantization: \[atlas-cloud\]"):
        ProviderTable(only_unknown, ProviderPolicy()).require_allowed()
    trusted = ProviderTable(ENDPOINTS, ProviderPolicy(trust_unknown_quantization=("novita",)))
    assert "novita" in {e.tag for e in trusted.allowed}
    assert "atlas-cloud/unknown" not in {e.tag for e in trusted.allowed}
    route = trusted.routing()
    assert "unknown" in route["quantizations"] and "novita" in route["only"]
    assert "atlas-cloud/unknown" not in route["only"]  # the pin keeps the untrusted unknown out


def test_require_parameters_excludes_endpoints_that_would_drop_a_parameter():
    sent = ("max_tokens", "temperature", "top_p")
    table = ProviderTable(ENDPOINTS, ProviderPolicy(), sent)
    assert sorted(e.tag for e in table.allowed) == CASE["allowed_tags_with_top_p"]
    assert reason(table, "siliconflow/int4") == "NO: lacks top_p (require_parameters)"
    relaxed = ProviderTable(ENDPOINTS, ProviderPolicy(require_parameters=False), sent)
    assert "siliconflow/int4" in {e.tag for e in relaxed.allowed}
    assert relaxed.routing()["require_parameters"] is False


def test_response_names_compare_case_insensitively_in_the_runner_and_the_data_check(tmp_path):
    table = ProviderTable(ENDPOINTS, ProviderPolicy(ignore=("fireworks",)))
    assert table.is_allowed_name("BaseTen") is False  # fp4 only: quantization, not the name, excludes it
    assert table.is_allowed_name("moonshot ai") and table.is_allowed_name("MOONSHOTAI")
    allowed = sorted({n for e in table.allowed for n in (e.provider_name, e.slug)})
    rows = [
        generated_row("a", provider="Moonshot AI"),
        generated_row("b", provider="moonshot ai"),
        generated_row("c", provider="DEEPINFRA"),
    ]
    assert v.check_allowed_providers(write_generated(tmp_path / "ok.parquet", rows), allowed, SETTINGS).passed
    bad = v.check_allowed_providers(
        write_generated(tmp_path / "bad.parquet", [*rows, generated_row("d", provider="Fireworks")]), allowed, SETTINGS
    )
    assert not bad.passed and bad.metadata["disallowed_rows"] == 1
    # Spelled as /endpoints spells it or as a response does, BaseTen is the same provider to the check.
    mixed = [generated_row("e", provider="Baseten"), generated_row("f", provider="BaseTen")]
    assert v.check_allowed_providers(write_generated(tmp_path / "bt.parquet", mixed), ["BaseTen"], SETTINGS).passed


def test_sampling_parameters_only_when_configured_and_every_removal_is_named():
    """Moonshot's own endpoint listed without temperature/top_p (as its K2.6 one is): sent by default, those
    parameters would drop the reference endpoint; now they are sent only when configured, and a removal is named."""
    from eagle_assets.generation.partition_runs import generation_settings
    from resources.openrouter.resource import OpenRouterResource

    listing = parse_endpoints(json.loads((FIXTURES / "account/endpoints_moonshot_no_sampling.json").read_text()))
    default = OpenRouterResource()
    assert "temperature" not in generation_settings(default).sampling and "top_p" not in default.requested_parameters(
        False
    )
    table = ProviderTable(listing, default.policy(), default.requested_parameters(False))
    assert "moonshotai/int4" in {e.tag for e in table.allowed} and table.removed_by_require_parameters() == []
    hot = OpenRouterResource(temperature=1.0, top_p=0.95)
    assert generation_settings(hot).sampling == {"temperature": 1.0, "top_p": 0.95}
    table = ProviderTable(listing, hot.policy(), hot.requested_parameters(False))
    removed = {e.tag: missing for e, missing in table.removed_by_require_parameters()}
    assert removed == {"moonshotai/int4": ["temperature", "top_p"], "siliconflow/int4": ["top_p"]}
    assert "moonshotai/int4" not in {e.tag for e in table.allowed}
    assert reason(table, "moonshotai/int4") == "NO: lacks temperature, top_p (require_parameters)"
    # An endpoint refused for another reason (fp4, status) is not reported as removed by require_parameters.
    assert not any(tag.startswith(("deepinfra/fp4", "fireworks", "together")) for tag in removed)
