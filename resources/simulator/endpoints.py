"""``GET /models/{author}/{slug}/endpoints``: the model's endpoint table, in the real listing's shape."""

from typing import Any

from aiohttp import web

from resources.simulator.config import MODEL_NAME, SimulatorConfig, per_token_string
from resources.simulator.wire import error_body, json_response


class EndpointRoutes:
    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self._models = {config.model_slug, config.model_permaslug}

    async def endpoints(self, request: web.Request) -> web.Response:
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        if model not in self._models:
            return json_response(404, error_body(404, f"Model {model} not found"))
        return json_response(200, endpoints_payload(self.config))


def endpoints_payload(config: SimulatorConfig) -> dict[str, Any]:
    return {
        "data": {
            "id": config.model_slug,
            "name": MODEL_NAME,
            "created": 1769472000,
            "description": "Kimi K2.5 (simulated endpoints)",
            "architecture": {
                "tokenizer": "Other",
                "instruct_type": None,
                "modality": "text+image->text",
                "input_modalities": ["text", "image"],
                "output_modalities": ["text"],
            },
            "endpoints": [
                {
                    "name": f"{e.name} | {config.model_permaslug}",
                    "model_name": MODEL_NAME,
                    "context_length": e.context_length,
                    "pricing": {
                        "prompt": per_token_string(e.prompt_usd_per_m),
                        "completion": per_token_string(e.completion_usd_per_m),
                        "request": "0",
                        "image": "0",
                        "web_search": "0",
                        "internal_reasoning": "0",
                        "discount": 0,
                    },
                    "provider_name": e.name,
                    "tag": e.tag,
                    "quantization": e.quantization,
                    "max_completion_tokens": e.max_completion_tokens,
                    "max_prompt_tokens": None,
                    "supported_parameters": list(e.parameters),
                    "status": e.status,
                    "uptime_last_30m": e.uptime_last_30m,
                    "supports_implicit_caching": False,
                }
                for e in config.providers
            ],
        }
    }
