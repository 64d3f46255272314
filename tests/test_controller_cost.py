"""The single controller's batch moves (costmodel.train_time.controller_s): hand-computed bytes, a cost the GPU
count does not divide, and the stack's bandwidth against the published rows it was measured on."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_tune.core.hardware import with_stack
from grpo_tune.core.specs import load_hardware
from grpo_tune.costmodel.train_time import controller_s
from grpo_tune.validate.grpo import load_grpo_rows, plan, predict, verl_flops


def _row(rid: str):
    return next(r for r in load_grpo_rows() if r.id == rid)


def test_bytes_by_hand_for_the_30b_row():
    # 8,192 sequences padded to 2,048 + 8,192 columns. A log-prob call: input_ids, attention_mask, position_ids
    # (prompt + response), prompts, responses, response_mask as int64, the scores in and the log-probs out as
    # float32: 8 x (4 x 2048 + 5 x 8192) + 4 x 2 x 8192 = 458,752 bytes a sequence. The update (KL on) adds
    # rewards, old log-probs, advantages, returns and the reference log-probs: 8 x 49,152 + 4 x 6 x 8192 = 589,824.
    _, hw, _, _, wl = plan(_row("verl_fullyasync_qwen3_30ba3b_colocate128"))
    bw = hw.efficiency.controller_bytes_per_s
    assert bw == pytest.approx(3.4e8)
    assert controller_s(hw, wl, "logprob") == pytest.approx(8192 * 458_752 / bw, rel=1e-12)  # 11.05 s
    assert controller_s(hw, wl, "update") == pytest.approx(8192 * 589_824 / bw, rel=1e-12)  # 14.21 s
    assert controller_s(hw, wl, "rollout") == pytest.approx(8192 * 8 * (4 * 2048 + 4 * 8192) / bw, rel=1e-12)
    # a stack that does not state a bandwidth prices none
    nemo = with_stack(load_hardware("h20"), "nemo-rl-v0.3")
    assert controller_s(nemo, wl, "update") == 0.0


def test_the_cost_is_the_same_on_32_and_128_gpus():
    # the 96 + 32 pair's training pool and its colocated 128-GPU twin move the same batch: the same seconds
    row = _row("verl_fullyasync_qwen3_30ba3b_colocate128")
    est128 = predict(row)[1]
    small = dataclasses.replace(row, raw={**row.raw, "gpus": "32"})
    est32 = predict(small)[1]
    for k in ("controller_logprob_s", "controller_update_s", "controller_rollout_s"):
        assert est32.details[k] == pytest.approx(est128.details[k]) and est128.details[k] > 5.0
    # ...and verl's MFU (timed inside the worker, update_policy) leaves it out
    m, hw, cluster, _, wl = plan(row)
    mfu = predict(row)[0]["train_mfu"]
    upd = est128.time["update"] - est128.details["controller_update_s"]
    assert mfu == pytest.approx(verl_flops(m, wl) * wl.ppo_epochs / (upd * cluster.gpus * hw.peak_flops_per_s()))


def test_the_bandwidth_reproduces_the_fsdp2_scaling_rows():
    # verl docs/advance/fully_async.md, 7B colocated on FSDP2 at 32 / 64 / 128 H20 (the same 512 x 16 batch, 2,048 +
    # 28,672 columns; verl puts each DP chunk once, so the batch crosses once whatever the SP and DP sizes). Old
    # log-prob T = bytes / B + W / GPUs, least squares over the three rows: B within 5% of the stack's 0.34 GB/s.
    rows = {r.id: r for r in load_grpo_rows()}
    pts = []
    for g in (32, 64, 128):
        r = rows[f"verl_fullyasync_qwen25math7b_fsdp2_colocate{g}"]
        pts.append((g, float(r.raw["old_lp_s"])))
    p, resp, seqs = 2048, 28672, 512 * 16
    nbytes = seqs * (8 * (4 * p + 5 * resp) + 4 * 2 * resp)  # 11.8 GB
    xs = [1.0 / g for g, _ in pts]
    ys = [t for _, t in pts]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = my - slope * mx  # 35.2 s that 4x more GPUs do not divide
    stack_bw = with_stack(load_hardware("h20"), "verl-0.9.1").efficiency.controller_bytes_per_s
    assert nbytes / fixed == pytest.approx(stack_bw, rel=0.05)
