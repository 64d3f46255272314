"""The one Strategy/Workload/TrainerOptions <-> verl table: every field has a row, plan -> overrides ->
plan is the identity (on the plans verl can express), and the emitted launch sets every priced
assumption itself instead of leaning on verl's defaults."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl import table
from grpo_tune.frameworks.verl.diagnose import parse_override_list, parse_script
from grpo_tune.frameworks.base.sections import SECTIONS, sections_of
from grpo_tune.frameworks.verl.export import verl_overrides, verl_script
from grpo_tune.core.config import TrainerOptions
from grpo_tune.core.strategy import SYNC_BUCKET_MB, Cluster, Strategy, Workload
from _export_configs import ENGINE_KNOBS, configs


def test_every_field_has_exactly_one_row():
    for section, cls in SECTIONS.items():
        names = [r.field for r in table.rows(section)]
        fields = Strategy.knob_names() if cls is Strategy else [f.name for f in dataclasses.fields(cls)]
        assert sorted(names) == sorted(fields), section
    for r in table.ROWS:
        assert (r.write is None) == (not r.keys) or r.field == "gpus"
        if not r.keys:
            assert r.why, r.field


def test_every_key_exists_in_verl_or_is_marked_plus():
    for r in table.ROWS:
        for k in r.keys:
            status = verl.key_status(k.lstrip("+"))
            if k.startswith("+"):
                assert status in ("open", "unknown"), k  # Hydra adds it; `+` on a declared key is refused
            else:
                assert status == "declared", k


def _reader(overrides: list[str], *, defaults: bool):
    ovs, findings = parse_override_list("\n".join(overrides))
    assert not findings
    values = {o.key: o.value for o in ovs}
    return lambda k: values[k] if k in values else (verl.default(k) if defaults else None)


pos = st.integers(1, 64)


@st.composite
def plans(draw):
    tp, pp, cp = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 3, 4]))
    gpus = tp * pp * cp * dp
    gpn = draw(st.sampled_from([1, 2, 4, 8, 16]))
    if gpus > gpn and gpus % gpn:
        gpn = gpus  # verl's nodes are uniform
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    dyn = draw(st.one_of(st.none(), st.integers(1024, 65536)))
    frac = st.floats(0.01, 1.0, allow_nan=False)
    s = Strategy.of(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        vpp=draw(st.sampled_from([1, 2])) if pp > 1 else 1,
        ep=draw(st.sampled_from([1, 2, 4])),
        etp=draw(st.sampled_from([None, 1, tp])),
        mbs=draw(pos),
        log_prob_mbs=draw(st.one_of(st.none(), pos)),
        sequence_parallel=draw(st.sampled_from([None, True, False])),
        recompute=recompute,
        recompute_layers=draw(st.one_of(st.none(), pos)) if recompute == "full" else None,
        distributed_optimizer=draw(st.booleans()),
        offload=draw(
            st.sampled_from(
                [
                    (),
                    ("param", "grad"),
                    ("optimizer",),
                    ("param", "grad", "optimizer"),
                    ("param",),
                    ("grad", "optimizer"),
                ]
            )
        ),
        first_stage_layers=draw(st.one_of(st.none(), pos)),
        last_stage_layers=draw(st.one_of(st.none(), pos)),
        rollout_tp=draw(st.sampled_from([1, 2, 4, 8])),
        gpu_memory_utilization=draw(frac),
        max_tokens_per_gpu=dyn,
        log_prob_max_tokens_per_gpu=draw(st.one_of(st.none(), st.integers(1024, 65536))),
        cpu_optimizer=draw(st.one_of(st.none(), frac)),
        overlap_cpu_optimizer=draw(st.booleans()),
        precision_aware_optimizer=draw(st.booleans()),
        max_num_seqs=draw(st.integers(1, 4096)),
        max_num_batched_tokens=draw(st.integers(256, 1 << 20)),
        enforce_eager=draw(st.booleans()),
        chunked_prefill=draw(st.booleans()),
        free_cache_engine=draw(st.booleans()),
        sync_bucket_mb=draw(st.one_of(st.just(SYNC_BUCKET_MB), st.integers(1, 1 << 16))),
    )
    mini = draw(pos)
    w = Workload(
        prompts=mini * draw(st.integers(1, 8)),
        n=draw(pos),
        prompt_len=draw(st.integers(1, 1 << 17)),
        response_len=draw(st.integers(1, 1 << 17)),
        mini_batch=mini,
        ppo_epochs=draw(st.integers(1, 4)),
        kl=draw(st.booleans()),
        entropy=True,  # entropy_coef below is > 0, and verl computes the entropy then (what the plan prices)
        dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
        prompt_len_mean=draw(st.one_of(st.none(), pos)),
    )
    num = st.floats(1e-9, 10, allow_nan=False)
    t = TrainerOptions(
        lr=draw(num),
        weight_decay=draw(num),
        grad_clip=draw(num),
        seed=draw(st.integers(0, 1 << 31)),
        steps=draw(st.integers(1, 10**6)),
        temperature=draw(num),
        top_p=draw(frac),
        clip_ratio=draw(frac),
        clip_ratio_high=draw(st.one_of(st.none(), frac)),
        loss_agg_mode=draw(st.sampled_from(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])),
        kl_coef=draw(num),
        kl_type=draw(st.sampled_from(["low_var_kl", "kl", "mse"])),
        entropy_coef=draw(num),
        norm_adv_by_std=draw(st.booleans()),
        moe_aux_loss_coeff=draw(num),
        moe_router_load_balancing_type=draw(st.sampled_from(["aux_loss", "seq_aux_loss", "none"])),
    )
    return {"strategy": s, "workload": w, "trainer": t, "cluster": Cluster(gpus=gpus, gpus_per_node=gpn)}


@given(plans())
def test_plan_to_overrides_to_plan_is_the_identity(plan):
    ovs = table.overrides(table.write_sections(plan))
    assert len({o.split("=", 1)[0] for o in ovs}) == len(ovs)
    assert table.read_sections(_reader(ovs, defaults=True)) == table.canonical(plan)


@given(plans())
def test_no_priced_assumption_is_left_to_verls_defaults(plan):
    """Read back with no verl defaults at all: every field with a verl setting must still come back."""
    ovs = table.overrides(table.write_sections(plan))
    assert table.read_sections(_reader(ovs, defaults=False)) == table.canonical(plan)


def test_the_emitted_launch_script_carries_the_priced_plan():
    """verl.sh as bash words -> diagnose's parser -> the table's reader: the plan that was priced."""
    for name, cfg in configs().items():
        ovs, findings, _ = parse_script(verl_script(cfg))
        values = {o.key: o.value for o in ovs}
        got = table.read_sections(lambda k: values.get(k))
        assert got == table.canonical(sections_of(cfg)), name


def test_new_contract_fields_reach_verl():
    cfg = configs()["7b-tp2"]
    s = cfg.strategy.replace(**ENGINE_KNOBS)
    ov = verl_overrides(cfg.replace(strategy=s))
    a, o, r = (
        "actor_rollout_ref.actor",
        "+actor_rollout_ref.actor.optim.override_optimizer_config",
        "actor_rollout_ref.rollout",
    )
    for want in (
        f"{a}.use_dynamic_bsz=True",
        f"{a}.ppo_max_token_len_per_gpu=12000",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        f"{r}.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=24000",
        f"{r}.log_prob_max_token_len_per_gpu=24000",
        f"{o}.optimizer_cpu_offload=True",
        f"{o}.optimizer_offload_fraction=0.5",
        f"{o}.overlap_cpu_optimizer_d2h_h2d=True",
        f"{o}.use_precision_aware_optimizer=True",
        f"{r}.max_num_seqs=64",
        f"{r}.max_num_batched_tokens=4096",
        f"{r}.enforce_eager=True",
        f"{r}.enable_chunked_prefill=False",
        f"{r}.free_cache_engine=False",
        f"{r}.checkpoint_engine.update_weights_bucket_megabytes=512",
        f"data.max_prompt_length={cfg.workload.prompt_len}",
        f"data.max_response_length={cfg.workload.response_len}",
    ):
        assert want in ov, want


def test_a_smaller_cluster_than_a_node_is_not_rounded_up_to_a_node():
    cfg = configs()["7b-tp2"]
    small = cfg.replace(cluster=Cluster(gpus=4, gpus_per_node=8))
    ov = verl_overrides(small)
    assert "trainer.n_gpus_per_node=4" in ov and "trainer.nnodes=1" in ov


def test_the_log_prob_micro_batch_has_its_own_keys_both_ways():
    """verl's rollout/ref log_prob_micro_batch_size_per_gpu carry log_prob_mbs, the actor's ppo key carries
    mbs; unset (or equal to mbs) writes mbs to all three, and a launch's 8 vs 4 reads back as 8 vs 4."""
    cfg = configs()["7b-tp2"]
    lp_keys = [f"actor_rollout_ref.{r}.log_prob_micro_batch_size_per_gpu" for r in ("ref", "rollout")]
    s = cfg.strategy.replace(mbs=4, max_tokens_per_gpu=None, log_prob_mbs=None)
    ov = verl_overrides(cfg.replace(strategy=s))
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4" in ov
    assert all(f"{k}=4" in ov for k in lp_keys)
    ov = verl_overrides(cfg.replace(strategy=s.replace(log_prob_mbs=8)))
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4" in ov
    assert all(f"{k}=8" in ov for k in lp_keys)
    got = table.read_sections(_reader(ov, defaults=True))
    assert (got["strategy"].batching.mbs, got["strategy"].batching.log_prob_mbs) == (4, 8)


def test_the_weight_sync_bucket_is_written_even_at_verls_default():
    """The cost model prices the bucket (weight_sync memory and time), so verl.sh sets it, at 2048 too,
    rather than leaving it to verl's default; a launch's 512 reads back as 512, one without it as 2048."""
    key = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
    cfg = configs()["7b-tp2"]
    assert cfg.strategy.rollout.sync_bucket_mb == SYNC_BUCKET_MB == 2048
    assert f"{key}=2048" in verl_script(cfg).split()
    ov = verl_overrides(cfg.replace(strategy=cfg.strategy.replace(sync_bucket_mb=512)))
    assert f"{key}=512" in ov
    assert table.read_sections(_reader(ov, defaults=True))["strategy"].rollout.sync_bucket_mb == 512
    without = [o for o in ov if not o.startswith(key + "=")]
    assert table.read_sections(_reader(without, defaults=True))["strategy"].rollout.sync_bucket_mb == 2048
