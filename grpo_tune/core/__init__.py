"""The contract every layer shares: errors, model/hardware specs, strategy and workload, the run config.

Beneath everything: ``profiles/`` data is read here, ``costmodel/`` prices it, ``autotune/`` searches
it, ``trainer/`` runs it, ``cli/`` drives them all. Imports no torch, megatron or vllm.
"""
