"""grpo-tune's analytic cost model: pure functions over core's specs, no torch, no megatron, no vllm."""

from .estimate import Estimate, estimate
from .params import active_params, max_rank_params, per_stage_params, total_params

__all__ = ["Estimate", "active_params", "estimate", "max_rank_params", "per_stage_params", "total_params"]
