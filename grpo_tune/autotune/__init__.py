"""grpo-tune's search, refinement and CLI layer. Imports no torch, megatron or vllm."""

__version__ = "0.1.0"
