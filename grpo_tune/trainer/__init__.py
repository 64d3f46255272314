"""The GRPO trainer on megatron-core: the only package that imports torch, megatron.core or vllm.

Modules: ``compat`` (CPU shims for megatron-core, active only without CUDA), ``parallel``
(process groups from a Strategy), ``model`` (GPTModel from a ModelSpec), ``hf`` (Hugging Face
import/export), ``engine`` (model + DDP + optimizer with logprobs / train_step / export),
``rollout`` (sampling engines), ``loop`` (the GRPO step), ``main`` (the torchrun worker).
"""
