"""Starting and watching a training run: tiny's search works with default lengths and emits an lr
that learns, ``train --set`` overrides best.yaml keys (checked like the file), and metrics carry
verl's names in metrics.jsonl, TensorBoard and (when asked for) wandb.

The unit tests run in-process; ``test_a_two_rank_run_logs_verl_names_once`` is a real 2-rank
torchrun (slow group).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from grpo_tune.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
STEP = {
    "step": 3,
    "reward_mean": 0.25,
    "response_len": 3.5,
    "response_len_max": 4,
    "entropy": 4.1,
    "step_s": 0.3,
    "phases_s": {"rollout": 0.1, "weight_sync": 0.0, "old_logprob": 0.05, "ref_logprob": 0.04, "update": 0.1},
    "tokens": 900,
    "tokens_per_s_per_gpu": 1500.0,
    "loss": -0.01,
    "pg_loss": -0.02,
    "kl": None,
    "clip_frac": 0.1,
    "approx_kl": 0.001,
    "grad_norm": 0.5,
}


def _search_tiny(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "runs"
    rc = main(["search", "--model", "tiny", "--gpus", "2", "--hardware", "cpu", "--out", str(out), *extra])
    assert rc == 0
    (best,) = out.glob("*/best.yaml")
    return best


# ---- verl's names -----------------------------------------------------------------------------------


def test_a_step_maps_onto_verls_metric_names():
    """Names from verl 0.9.1's metric_utils/ray_trainer (shared/facts/verl-metrics.md); values unchanged;
    a missing value (kl without a reference) is left out, not logged as 0."""
    from grpo_tune.trainer.tracking import verl_metrics

    v = verl_metrics(STEP)
    assert v["actor/pg_loss"] == -0.02 and v["actor/entropy"] == 4.1 and v["actor/pg_clipfrac"] == 0.1
    assert v["actor/ppo_kl"] == 0.001 and v["actor/grad_norm"] == 0.5
    assert v["critic/rewards/mean"] == v["critic/score/mean"] == 0.25
    assert v["response_length/mean"] == 3.5 and v["response_length/max"] == 4.0
    assert (v["timing_s/gen"], v["timing_s/update_weights"], v["timing_s/old_log_prob"]) == (0.1, 0.0, 0.05)
    assert (v["timing_s/ref"], v["timing_s/update_actor"], v["timing_s/step"]) == (0.04, 0.1, 0.3)
    assert v["perf/throughput"] == 1500.0 and v["perf/total_num_tokens"] == 900 and v["perf/time_per_step"] == 0.3
    assert "actor/kl_loss" not in v
    no_ref = verl_metrics({**STEP, "phases_s": {**STEP["phases_s"], "ref_logprob": 0.0}})
    assert "timing_s/ref" not in no_ref and no_ref["timing_s/gen"] == 0.1


def test_wandb_gets_the_same_names_when_asked_for(monkeypatch, tmp_path):
    from grpo_tune.core.config import TrainerOptions, load
    from grpo_tune.trainer.tracking import Tracking, verl_metrics

    calls: list = []
    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw["project"])),
        log=lambda m, step: calls.append(("log", step, sorted(m))),
        finish=lambda: calls.append(("finish",)),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = load(_search_tiny(tmp_path))
    import dataclasses

    cfg = cfg.replace(trainer=dataclasses.replace(cfg.trainer, tensorboard=False, wandb_project="grpo"))
    tr = Tracking(cfg, tmp_path / "run")
    tr.log(verl_metrics(STEP), 3)
    tr.close()
    assert calls == [("init", "grpo"), ("log", 3, sorted(verl_metrics(STEP))), ("finish",)]
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed: a coded error, not a traceback
    from grpo_tune.core.errors import GrpoTuneError

    with pytest.raises(GrpoTuneError) as ei:
        Tracking(cfg, tmp_path / "run")
    assert ei.value.code == "MISSING_DEPENDENCY" and "pip install wandb" in ei.value.hint
    assert TrainerOptions().tensorboard is True and TrainerOptions().wandb_project is None


# ---- tiny's search and best.yaml ----------------------------------------------------------------------


def test_tiny_searches_with_default_lengths_and_emits_a_learning_lr(tmp_path):
    """The default 1024 + 1024 tokens exceed tiny's 256 positions: the search scales them to 128 + 128
    and says so in best.yaml; the emitted lr is the from-scratch one (3e-3), stated in meta."""
    doc = yaml.safe_load(_search_tiny(tmp_path).read_text())
    w = doc["workload"]
    assert (w["prompt_len"], w["response_len"]) == (128, 128)
    assert "default lengths 1024 + 1024 exceed tiny's 256 positions: using 128 + 128" in w["lengths_source"]
    assert doc["trainer"]["lr"] == 3e-3 and "random init" in doc["meta"]["lr_note"]


def test_lengths_the_user_chose_stay_an_error_when_too_long(tmp_path, capsys):
    rc = main(["search", "--model", "tiny", "--gpus", "2", "--hardware", "cpu", "--prompt-len", "512"])
    assert rc == 2 and "exceeds tiny's max_seq_len 256" in capsys.readouterr().err


# ---- train --set --------------------------------------------------------------------------------------


def test_set_overrides_keys_of_best_yaml_and_reaches_the_workers(tmp_path, capsys):
    best = _search_tiny(tmp_path)
    capsys.readouterr()
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1=", "answer": "1"}\n')
    rc = main(
        ["train", "--config", str(best), "--dry-run", "--json"]
        + ["--set", "trainer.lr=3e-4", "--set", f"trainer.dataset={data}", "--set", "workload.n=4"]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(out)
    assert doc["workload"]["n"] == 4  # the summary is of the overridden config
    cmd = doc["command"]
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert sets == ["trainer.lr=3e-4", f"trainer.dataset={data}", "workload.n=4"]  # the workers apply them too
    from grpo_tune.trainer.main import load_config, parse_args

    cfg = load_config(parse_args(["--config", str(best), *[a for s in sets for a in ("--set", s)]]))
    assert (cfg.trainer.lr, cfg.trainer.dataset, cfg.workload.n) == (3e-4, str(data), 4)
    assert yaml.safe_load(best.read_text())["trainer"]["lr"] == 3e-3  # the file itself is untouched


@pytest.mark.parametrize(
    "item,code,words",
    [
        ("trainer.lrr=1", "UNKNOWN_KEY", "did you mean 'lr'"),
        ("trainr.lr=1", "UNKNOWN_KEY", "did you mean 'trainer'"),
        ("trainer.lr=fast", "BAD_CONFIG", "trainer.lr must be a number"),
        ("trainer.steps=0", "BAD_CONFIG", "trainer.steps must be a positive integer"),
        ("trainer.lr", "BAD_CONFIG", "expected SECTION.KEY=VALUE"),
        ("strategy.tp=3", "INVALID_DEGREES", "does not divide 2 GPUs"),
    ],
)
def test_a_bad_set_is_a_coded_error(tmp_path, capsys, item, code, words):
    best = _search_tiny(tmp_path)
    capsys.readouterr()
    rc = main(["train", "--config", str(best), "--dry-run", "--set", item])
    err = capsys.readouterr().err
    assert rc == 2 and f"[{code}]" in err and words in err and "Traceback" not in err, err


# ---- a real run -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_two_rank_run_logs_verl_names_once(tmp_path):
    """2 ranks (DP2), 3 steps: metrics.jsonl and TensorBoard carry verl's names, and megatron's five
    Apex/Transformer Engine fallback warnings per rank become one line from rank 0."""
    import subprocess

    best = _search_tiny(
        tmp_path, "--prompts", "16", "--mini-batch", "16", "--n", "4", "--prompt-len", "8", "--response-len", "4"
    )
    best = best.with_name("best.yaml")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from grpo_tune.cli.main import run; run()",
            "train",
            "--config",
            str(best),
            "--steps",
            "3",
        ]
        + ["--set", "trainer.checkpoint_every=3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = Path(yaml.safe_load(best.read_text())["trainer"]["out_dir"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2, 3]
    assert all(x["critic/rewards/mean"] == x["reward_mean"] and x["timing_s/gen"] > 0 for x in rows)
    log = (run / "train.log").read_text()
    assert log.count("not installed") == 1 and "megatron-core uses its PyTorch fallbacks" in log, log[-2000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run / "tensorboard").iterdir()
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"actor/pg_loss", "critic/rewards/mean", "timing_s/gen", "timing_s/update_actor"} <= tags
    assert [e.step for e in acc.Scalars("critic/rewards/mean")] == [1, 2, 3]
