"""grpo-tune: plan, price, emit and run the parallel strategy of GRPO training on a Megatron backend.

The one import package the wheel installs. Its sub-packages follow the data flow:
``profiles`` (data) -> ``costmodel`` (pure pricing) -> ``autotune`` (search, refine, calibrate)
-> emitted config -> ``trainer`` (megatron-core GRPO); ``core`` is the contract beneath them all and
``cli`` sits on top.
"""

__version__ = "0.1.0"
