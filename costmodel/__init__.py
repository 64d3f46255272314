"""grpo-tune's analytic cost model: pure functions, no torch, no megatron, no vllm."""
from .errors import GrpoTuneError
from .params import active_params, max_rank_params, per_stage_params, total_params
from .specs import HardwareSpec, ModelSpec, list_hardware, list_models, load_hardware, load_model
from .strategy import Cluster, Strategy, Workload, validate

__all__ = [
    "Cluster", "GrpoTuneError", "HardwareSpec", "ModelSpec", "Strategy", "Workload",
    "active_params", "list_hardware", "list_models", "load_hardware", "load_model",
    "max_rank_params", "per_stage_params", "total_params", "validate",
]
