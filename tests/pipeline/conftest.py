import pytest

from resources.duckdb.resource import DuckDBResource
from resources.serving.resource import ServingEngineResource
from resources.target.resource import TargetModelResource
from resources.target.training_pipes import training_pipes_client
from tests.generation.test_dagster_generation import resource_for


@pytest.fixture
def forge_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def pipeline_resources(base_url: str, max_tokens: int) -> dict[str, object]:
    """Every resource the pipeline's assets need, against a simulator at ``base_url``."""
    return {
        "openrouter": resource_for(base_url, max_tokens=max_tokens),
        "duckdb": DuckDBResource(),
        "target": TargetModelResource(),
        "serving": ServingEngineResource(),
        "pipes_subprocess_client": training_pipes_client(),
    }
