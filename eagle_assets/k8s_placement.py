"""Where each step runs on Kubernetes: ``dagster-k8s/config`` op tags, read by ``dagster-k8s``.

With the ``k8s_job_executor`` (``EAGLE_FORGE_EXECUTOR=k8s`` in the code location's environment, as in
``deploy/k8s/values.yaml``) every step is a pod of its own, shaped by its op's ``dagster-k8s/config`` tag:

- generation, tokenization and the corpus run on CPU nodes (a node selector for the CPU pool, modest
  requests: the engine drives 2000 requests from one core);
- hidden states and training request the GPUs (``nvidia.com/gpu``, 8 by default: the target's tensor
  parallelism), a GPU node selector and the GPU taint's toleration.

Elsewhere the tags are inert: the default multiprocess executor never reads them. The numbers and labels
come from the environment so one image serves any cluster.
"""

import os
from typing import Any

from eagle_assets.keys import K8S_CONFIG_TAG

DEFAULT_GPUS = 8
DEFAULT_GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}  # set by NVIDIA's GPU feature discovery
DEFAULT_CPU_NODE_SELECTOR = {"eagle-forge/node-pool": "cpu"}


def _selector(env: str, default: dict[str, str]) -> dict[str, str]:
    """``key=value[,key=value]`` from the environment, else the default."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return dict(default)
    out = {}
    for pair in raw.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{env} must be key=value[,key=value], got {raw!r}")
        out[key.strip()] = value.strip()
    return out


def gpu_step_tags() -> dict[str, Any]:
    """Op tags for a step that needs the target's GPUs (``EAGLE_FORGE_K8S_GPUS``, ``…_GPU_NODE_SELECTOR``)."""
    gpus = str(int(os.environ.get("EAGLE_FORGE_K8S_GPUS", DEFAULT_GPUS)))
    return {
        K8S_CONFIG_TAG: {
            "container_config": {
                "resources": {
                    "requests": {"cpu": "16", "memory": "200Gi", "nvidia.com/gpu": gpus},
                    "limits": {"nvidia.com/gpu": gpus},
                },
            },
            "pod_spec_config": {
                "node_selector": _selector("EAGLE_FORGE_K8S_GPU_NODE_SELECTOR", DEFAULT_GPU_NODE_SELECTOR),
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
    }


def cpu_step_tags() -> dict[str, Any]:
    """Op tags for a step that needs no GPU (``EAGLE_FORGE_K8S_CPU_NODE_SELECTOR``)."""
    return {
        K8S_CONFIG_TAG: {
            "container_config": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}}},
            "pod_spec_config": {
                "node_selector": _selector("EAGLE_FORGE_K8S_CPU_NODE_SELECTOR", DEFAULT_CPU_NODE_SELECTOR)
            },
        }
    }


def executor_from_env() -> Any:
    """``EAGLE_FORGE_EXECUTOR=k8s``: a pod per step (dagster-k8s); unset: Dagster's default executor."""
    choice = os.environ.get("EAGLE_FORGE_EXECUTOR", "").strip().lower()
    if choice in ("", "default", "multiprocess"):
        return None
    if choice == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    raise ValueError(f"EAGLE_FORGE_EXECUTOR must be 'k8s' or unset, got {choice!r}")
