"""Megatron-LM: a plan's training side as ``pretrain_gpt.py`` flags (:mod:`.args`)."""
