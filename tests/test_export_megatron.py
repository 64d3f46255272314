"""Megatron-LM flags: every emitted flag is declared in Megatron-LM's arguments.py, and the values
are the plan's."""

from __future__ import annotations

import argparse
import json
import shlex
import re

import pytest

from grpo_tune.frameworks.megatron_lm.args import megatron_args, megatron_args_text
from grpo_tune.frameworks.megatron_lm.args import DATA_DIR
from _export_configs import configs, make

FLAGS_FILE = DATA_DIR / "megatron-lm-arguments-flags.txt"


def declared_flags() -> set[str]:
    return {l.strip() for l in FLAGS_FILE.read_text().splitlines() if l.strip().startswith("--")}


def undeclared(args: list[str], flags: set[str]) -> list[str]:
    return [a for a in args if a.startswith("--") and a not in flags]


def as_namespace(args: list[str]) -> argparse.Namespace:
    """Parse the emitted flags the way Megatron would (flags with values vs store_true switches)."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        if takes_value:
            p.add_argument(a, nargs="+" if a == "--recompute-modules" else None)
        else:
            p.add_argument(a, action="store_true")
    return p.parse_args(args)


def test_flag_list_has_its_source():
    head = FLAGS_FILE.read_text().splitlines()[:4]
    assert any("NVIDIA/Megatron-LM" in l for l in head)
    assert any(re.search(r"commit [0-9a-f]{40}", l) for l in head)
    flags = declared_flags()
    assert len(flags) > 150
    # spot checks against what arguments.py declares
    for f in (
        "--tensor-model-parallel-size",
        "--num-virtual-stages-per-pipeline-rank",
        "--expert-tensor-parallel-size",
        "--decoder-first-pipeline-num-layers",
        "--recompute-num-layers",
        "--use-distributed-optimizer",
    ):
        assert f in flags


def test_the_check_catches_a_flag_that_does_not_exist():
    args = megatron_args(configs()["7b-tp2"]) + ["--grad-offload"]
    assert undeclared(args, declared_flags()) == ["--grad-offload"]


@pytest.mark.parametrize("name", sorted(configs()))
def test_every_emitted_flag_is_declared(name):
    args = megatron_args(configs()[name])
    assert undeclared(args, declared_flags()) == []
    assert len(args) == len(set(a for a in args if a.startswith("--"))) + sum(not a.startswith("--") for a in args)


@pytest.mark.parametrize("name", sorted(configs()))
def test_flag_values_follow_the_plan(name):
    cfg = configs()[name]
    s, m, w = cfg.strategy, cfg.model, cfg.workload
    ns = as_namespace(megatron_args(cfg))
    assert int(ns.tensor_model_parallel_size) == s.layout.tp
    assert int(ns.pipeline_model_parallel_size) == s.layout.pp
    assert int(ns.context_parallel_size) == s.layout.cp
    assert int(ns.micro_batch_size) == s.batching.mbs
    # one optimizer step per PPO mini-batch: mini_batch prompts x n responses
    assert int(ns.global_batch_size) == w.mini_batch * w.n
    assert int(ns.seq_length) == w.prompt_len + w.response_len
    assert int(ns.num_layers) == m.layers and int(ns.hidden_size) == m.hidden
    assert ns.sequence_parallel == s.layout.sp
    assert ns.use_distributed_optimizer == s.memory.distributed_optimizer
    assert getattr(ns, w.dtype) is True
    if s.layout.vpp > 1:
        assert int(ns.num_virtual_stages_per_pipeline_rank) == s.layout.vpp
    if s.layout.first_stage_layers:
        assert int(ns.decoder_first_pipeline_num_layers) == s.layout.first_stage_layers
    if m.is_moe:
        assert int(ns.expert_model_parallel_size) == s.layout.ep
        assert int(ns.expert_tensor_parallel_size) == s.layout.etp_
        assert int(ns.num_experts) == m.experts and int(ns.moe_router_topk) == m.top_k
    else:
        assert not hasattr(ns, "num_experts")
    if m.is_mla:
        assert ns.multi_latent_attention and int(ns.kv_lora_rank) == m.kv_lora_rank
    elif m.kv_heads != m.heads:
        assert int(ns.num_query_groups) == m.kv_heads
    if s.memory.recompute == "full":
        assert ns.recompute_granularity == "full"
        assert ns.recompute_method == ("uniform" if s.memory.recompute_layers is None else "block")


def test_dense_layers_pattern_counts_layers():
    cfg = configs()["deepseek-v3-cp"]
    args = megatron_args(cfg)
    pattern = args[args.index("--moe-layer-freq") + 1]
    layers = eval(pattern, {"__builtins__": {}})  # Megatron evaluates the same list expression
    assert len(layers) == cfg.model.layers and layers.count(0) == cfg.model.dense_layers


def test_text_form_keeps_every_flag():
    cfg = make("qwen2-7b", 8, tp=2, rollout_tp=2, offload=("param",))
    text = megatron_args_text(cfg)
    assert "Megatron-LM has no flag" in text
    lines = [l for l in text.splitlines() if l.startswith("--")]
    assert sum(a.startswith("--") for a in megatron_args(cfg)) == len(lines)


def test_separate_pools_header_names_the_training_pool():
    """The flags are the training side's: with separate pools they run on the training pool's GPUs, which the header
    names (tp1 pp3 cannot run on all 8 GPUs of an 8 = 2 + 6 split)."""
    import dataclasses

    from grpo_tune.core.placement import Placement

    cfg = make("qwen2-7b", 6, tp=1, pp=3, first_stage_layers=10, last_stage_layers=8)
    cfg = dataclasses.replace(
        cfg, cluster=dataclasses.replace(cfg.cluster, gpus=8), placement=Placement(mode="separate", rollout_gpus=2)
    )
    head = megatron_args_text(cfg).splitlines()[0]
    assert "training pool's 6 GPUs (of 8; 2 generate)" in head, head
    assert "on 8 GPUs" in megatron_args_text(make("qwen2-7b", 8, tp=2)).splitlines()[0]


def test_new_knobs_have_declared_megatron_flags():
    """The hybrid CPU optimizer and its companions reach Megatron-LM with the plan's values."""
    cfg = configs()["qwen3-30b-a3b-ep8"]
    s = cfg.strategy.replace(
        cpu_optimizer=0.25, overlap_cpu_optimizer=True, precision_aware_optimizer=True, max_tokens_per_gpu=8192
    )
    cfg = cfg.replace(strategy=s)
    args = megatron_args(cfg)
    assert undeclared(args, declared_flags()) == []
    ns = as_namespace(args)
    assert ns.optimizer_cpu_offload and float(ns.optimizer_offload_fraction) == 0.25
    assert ns.overlap_cpu_optimizer_d2h_h2d and ns.use_precision_aware_optimizer
    assert ns.moe_router_load_balancing_type == cfg.trainer.moe_router_load_balancing_type
    assert float(ns.moe_aux_loss_coeff) == cfg.trainer.moe_aux_loss_coeff
    assert "dynamic batching (8192 tokens per GPU)" in megatron_args_text(cfg)
    # verl's optimizer offload between phases is not Megatron's CPU optimizer
    assert "--optimizer-cpu-offload" not in megatron_args(configs()["7b-tp2"])


TYPED_FILE = DATA_DIR / "megatron-lm-arguments.json"


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's argument parser rebuilt from its typed flag table (every ``add_argument`` of
    megatron/training/arguments.py at the pinned commit: option strings, action, type, nargs, choices;
    benchmarks/extract_megatron_flags.py), with Megatron's ``allow_abbrev=False``."""
    doc = json.loads(TYPED_FILE.read_text())
    types = {"int": int, "float": float, "str": str, "custom": str}
    p = argparse.ArgumentParser(allow_abbrev=False)
    for r in doc["arguments"]:
        act = r.get("action", "store")
        kw: dict = {}
        if act in ("store_true", "store_false"):
            kw["action"] = act
        elif act == "BooleanOptionalAction":
            kw["action"] = argparse.BooleanOptionalAction
        elif act in ("store_const", "append_const"):
            kw.update(action=act, const=True)
        else:
            if act in ("append", "extend"):
                kw["action"] = act
            if r.get("type"):
                kw["type"] = types[r["type"]]
            if r.get("nargs") is not None:
                kw["nargs"] = r["nargs"]
            if r.get("choices"):
                kw["choices"] = r["choices"]
        p.add_argument(*r["flags"], **kw)
    return p


def _text_args(cfg) -> list[str]:
    text = megatron_args_text(cfg)
    return shlex.split("\n".join(ln for ln in text.splitlines() if not ln.startswith("#")))


def test_typed_flag_table_is_the_pinned_release_of_the_flag_list():
    doc = json.loads(TYPED_FILE.read_text())
    pinned = re.search(r"commit ([0-9a-f]{40})", FLAGS_FILE.read_text()).group(1)
    assert doc["commit"] == pinned and "NVIDIA/Megatron-LM" in doc["source"]
    flags = {f for r in doc["arguments"] for f in r["flags"]}
    assert declared_flags() <= flags and len(flags) > 500  # the whole parser, not only what we emit


def test_megatron_parser_refuses_what_megatron_refuses():
    p = megatron_parser()
    for bad in (
        ["--grad-offload"],  # not a Megatron flag
        ["--tensor-model-parallel-size", "two"],  # type=int
        ["--tokenizer-type", "Qwen2Tokenizer"],  # not one of its choices
        ["--overlap-grad"],  # allow_abbrev=False: no prefix matching
    ):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


@pytest.mark.parametrize("name", sorted(configs()))
def test_megatron_lm_parser_accepts_megatron_args_txt(name, capsys):
    """megatron_args.txt is a flag set Megatron-LM's parser takes whole, with the overlap and tokenizer flags a
    launch needs, and the cross-flag rules of its validate_args for them hold."""
    cfg = configs()[name]
    ns = megatron_parser().parse_args(_text_args(cfg))
    s = cfg.strategy
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size) == (
        s.layout.tp,
        s.layout.pp,
        s.layout.cp,
    )
    assert ns.overlap_grad_reduce is True
    assert ns.overlap_param_gather is s.memory.distributed_optimizer
    # validate_args: --overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce;
    # --optimizer-cpu-offload needs --use-precision-aware-optimizer
    if ns.overlap_param_gather:
        assert ns.use_distributed_optimizer and ns.overlap_grad_reduce
    if ns.optimizer_cpu_offload:
        assert ns.use_precision_aware_optimizer
    if cfg.model.hf_id:
        assert (ns.tokenizer_type, ns.tokenizer_model) == ("HuggingFaceTokenizer", cfg.model.hf_id)
    else:
        assert ns.tokenizer_type == "NullTokenizer" and ns.vocab_size == cfg.model.vocab
