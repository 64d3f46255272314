"""The GRPO loop on a fake engine (one process, no Megatron): batch layout, learning signal, exact resume.

The fake is a bigram language model (logits = table[previous token]) that implements the Engine
interface the loop uses: ``logprobs``, ``train_step``, ``next_token_logits``, ``state_dict``.
The real Engine runs in tests/test_trainer_learning.py and tests/test_trainer_checkpoint.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from grpo_tune.trainer import checkpoint
from grpo_tune.trainer.grpo import LossConfig
from grpo_tune.trainer.loop import GRPOLoop, Item, LoopConfig, build_batch
from grpo_tune.trainer.rollout.sampling import sample

V, PAD, EOS, BOS = 16, 0, 1, 2


class BigramEngine:
    """Engine-shaped fake: a V x V logits table, Adam, micro-batched train_step that sums partial losses."""

    def __init__(self, seed: int = 0, lr: float = 0.05):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(0.01 * torch.randn(V, V, generator=g))
        self.opt = torch.optim.Adam([self.table], lr=lr)

    def _logits(self, tokens):
        return self.table[tokens[:, :-1]]

    def logprobs(self, tokens, *, micro_batch_size, with_entropy=False, temperature=1.0):
        with torch.no_grad():
            z = torch.log_softmax(self._logits(tokens), -1)
            lp = z.gather(-1, tokens[:, 1:, None]).squeeze(-1)
            ent = -(z.exp() * z).sum(-1) if with_entropy else None
        return lp, ent

    def train_step(self, batch, loss_fn, *, micro_batch_size, with_entropy=False, temperature=1.0):
        """Like Engine.train_step: the gradient of the mean of loss_fn over micro-batches; mean metrics."""
        self.opt.zero_grad()
        B = batch["tokens"].shape[0]
        n = B // micro_batch_size
        sums: dict = {}
        for i in range(0, B, micro_batch_size):
            mb = {k: v[i : i + micro_batch_size] for k, v in batch.items()}
            mb["_scale_ctx"] = {"micro_batches": n, "rows": micro_batch_size}
            z = torch.log_softmax(self._logits(mb["tokens"]), -1)
            lp = z.gather(-1, mb["tokens"][:, 1:, None]).squeeze(-1)
            ent = -(z.exp() * z).sum(-1) if with_entropy else None
            loss, m = loss_fn(lp, ent, mb)
            (loss / n).backward()
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + float(v) / n
        self.opt.step()
        return sums

    def next_token_logits(self, tokens, lengths):
        with torch.no_grad():
            return self.table[tokens[torch.arange(tokens.shape[0]), lengths - 1]]

    def named_parameters_for_export(self):
        yield "table", self.table.detach()

    def state_dict(self):
        return {"table": self.table.detach().clone(), "opt": self.opt.state_dict()}

    def load_state_dict(self, st):
        with torch.no_grad():
            self.table.copy_(st["table"])
        self.opt.load_state_dict(st["opt"])


class FakeRollout:
    shares_actor_weights = True
    collective_batch = True

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompt_ids, params):
        return sample(self.engine.next_token_logits, prompt_ids, params, pad_id=PAD, eos_id=EOS)


def reward_token7(item, resp):
    """1 when the response starts with token 7 (chance ~1/16 for the untrained fake)."""
    return float(bool(resp) and resp[0] == 7)


def make_loop(tmp_path=None, *, steps_seed=0, checkpoint_every=0, kl=True):
    cfg = LoopConfig(
        prompts=4,
        n=8,
        mini_batch=2,
        ppo_epochs=2,
        mbs=4,
        max_response_len=3,
        seed=steps_seed,
        loss=LossConfig(kl_coef=0.01 if kl else 0.0, use_kl=kl),
    )
    actor = BigramEngine(0)
    ref = BigramEngine(0) if kl else None
    data = [Item(prompt_ids=[BOS, 3 + i % 5]) for i in range(10)]
    return GRPOLoop(
        cfg,
        actor=actor,
        ref=ref,
        rollout=FakeRollout(actor),
        dataset=data,
        reward_fn=reward_token7,
        pad_id=PAD,
        eos_id=EOS,
        out_dir=tmp_path,
        checkpoint_every=checkpoint_every,
    )


def test_build_batch_masks_exactly_the_response_predictions():
    tokens, mask = build_batch([[2, 5, 6], [2]], [[7, 1], [9, 9, 9]], pad_id=0, seq_multiple=4)
    assert tokens.shape == (2, 8)
    assert tokens[0].tolist() == [2, 5, 6, 7, 1, 0, 0, 0]
    # position t predicts tokens[t+1]: response tokens of row 0 sit at 3, 4 -> mask positions 2, 3
    assert mask[0].tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0]


def test_loop_learns_and_logs_every_metric(tmp_path):
    loop = make_loop(tmp_path)
    hist = loop.run(25)
    first = sum(h["reward_mean"] for h in hist[:3]) / 3
    last = sum(h["reward_mean"] for h in hist[-3:]) / 3
    assert last > first + 0.3, (first, last)
    rec = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rec] == list(range(1, 26))
    for k in ("loss", "reward_mean", "reward_std", "kl", "entropy", "clip_frac", "response_len", "tokens_per_s"):
        assert rec[-1][k] is not None, k
    assert set(rec[0]["phases_s"]) == {"rollout", "weight_sync", "old_logprob", "ref_logprob", "update"}
    # actor == reference until the first optimizer step; the policy then drifts from it
    assert 0 <= rec[0]["kl"] < 0.01 < rec[-1]["kl"]


def test_resume_replays_the_uninterrupted_run(tmp_path):
    full = make_loop(tmp_path / "a").run(6)
    part = make_loop(tmp_path / "b", checkpoint_every=2)
    part.run(3)  # checkpoints after steps 2 and 3 (the last step)
    assert checkpoint.latest(tmp_path / "b")["step"] == 3
    again = make_loop(tmp_path / "b", checkpoint_every=2)
    assert again.resume() == 3
    rest = again.run(6)
    assert [h["step"] for h in rest] == [4, 5, 6]
    for a, b in zip(full[3:], rest):
        assert b["loss"] == a["loss"] and b["reward_mean"] == a["reward_mean"]
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_loss_does_not_depend_on_the_micro_batch_split(mode):
    """The loop's loss_fn undoes the engine's mean over micro-batches: same loss and gradient for any mbs."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(3, V, (8, 7), generator=g)
    lens = [1, 2, 3, 4, 5, 6, 2, 3]  # ragged responses: micro-batch token counts differ
    mask = torch.zeros(8, 6)
    for i, n in enumerate(lens):
        mask[i, 6 - n :] = 1
    batch = {
        "tokens": tokens,
        "mask": mask,
        "old_logprobs": torch.full((8, 6), -2.7),
        "advantages": torch.randn(8, generator=g),
        "ref_logprobs": torch.full((8, 6), -2.8),
    }
    results = []
    for mbs in (1, 2, 8):
        loop = make_loop()
        loop.cfg.loss = LossConfig(kl_coef=0.1, loss_agg_mode=mode)
        eng = loop.actor
        eng.opt = torch.optim.SGD([eng.table], lr=1.0)  # the update then equals the gradient
        before = eng.table.detach().clone()
        num_tokens, num_seqs = float(mask.sum()), float((mask.sum(-1) > 0).sum())
        m = eng.train_step(batch, loop._loss_fn(num_tokens, num_seqs), micro_batch_size=mbs)
        results.append((m["loss"], before - eng.table.detach()))
    for loss, grad in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-5)
        assert torch.allclose(grad, results[0][1], atol=1e-6)
