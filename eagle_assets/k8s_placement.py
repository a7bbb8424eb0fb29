"""Where each step runs on Kubernetes: ``dagster-k8s/config`` op tags, read by ``dagster-k8s``.

With the ``k8s_job_executor`` every step is a pod shaped by its op's tag: CPU steps on the CPU pool with modest
requests (the engine drives 2000 requests from one core), GPU steps with ``nvidia.com/gpu``, a GPU node selector
and the taint's toleration (docs/deployment.md). Elsewhere the tags are inert. The numbers and labels come from
the environment so one image serves any cluster.
"""

from typing import Any

from eagle_assets.keys import K8S_CONFIG_TAG
from eagle_assets.settings import current_settings


def gpu_step_tags() -> dict[str, Any]:
    """Op tags for a step that needs the target's GPUs (``EAGLE_FORGE_K8S_GPUS``, ``…_GPU_NODE_SELECTOR``)."""
    settings = current_settings()
    gpus = str(settings.k8s_gpus)
    return {
        K8S_CONFIG_TAG: {
            "container_config": {
                "resources": {
                    "requests": {"cpu": "16", "memory": "200Gi", "nvidia.com/gpu": gpus},
                    "limits": {"nvidia.com/gpu": gpus},
                },
            },
            "pod_spec_config": {
                "node_selector": dict(settings.k8s_gpu_node_selector),
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
    }


def cpu_step_tags() -> dict[str, Any]:
    """Op tags for a step that needs no GPU (``EAGLE_FORGE_K8S_CPU_NODE_SELECTOR``)."""
    return {
        K8S_CONFIG_TAG: {
            "container_config": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}}},
            "pod_spec_config": {"node_selector": dict(current_settings().k8s_cpu_node_selector)},
        }
    }


def executor_from_env() -> Any:
    """``EAGLE_FORGE_EXECUTOR=k8s``: a pod per step (dagster-k8s); unset: Dagster's default executor."""
    if current_settings().executor != "k8s":
        return None
    from dagster_k8s import k8s_job_executor

    return k8s_job_executor
