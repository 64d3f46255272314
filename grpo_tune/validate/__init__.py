"""The cost model against published measurements (``grpo-tune validate``).

- :mod:`.pretraining`: Megatron-LM pre-training iterations (papers' own metrics);
- :mod:`.grpo`: GRPO steps and phases that verl and NeMo-RL published (``--grpo``).
"""
