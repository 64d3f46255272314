"""calibrate --from-log on NeMo-RL's logs: TensorBoard event files written with the writer NeMo-RL uses
(torch's SummaryWriter, as NeMo-RL 0.7.0's TensorboardLogger), read with TensorBoard's EventAccumulator, and
NeMo-RL's console timing table; a synthetic truth (tests/fixtures/nemo_rl_logs/make_fixtures.py) recovered.

The truth is the cost model's own prediction with perturbed knobs, so the logs are written into a temporary
folder from today's cost model each run (nothing binary is committed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from grpo_tune.autotune.calibrate import runlog as R
from grpo_tune.autotune.calibrate.fit import defaults
from grpo_tune.cli.main import main
from grpo_tune.frameworks.nemo_rl import logs as L

FIX = Path(__file__).resolve().parent / "fixtures" / "nemo_rl_logs"
TRUTH_KNOBS = (
    "compute_efficiency_scale,comm_efficiency_scale,rollout_efficiency_scale,rollout_overhead_s,"
    "weight_sync_overhead_s,step_overhead_s"
)


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("nemo_rl_make_fixtures", FIX / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("nemo_rl_logs")
    mod.write_all(out)
    return out


def test_tensorboard_log_reads_as_nemo_rl_wrote_it(logs):
    truth = json.loads((logs / "truth.json").read_text())["logs"]["run_a"]
    log = R.read_log(logs / "run_a")  # the run's log folder: its tensorboard/ is found below
    assert log.format == L.FORMAT_TB and [r.step for r in log.records] == list(range(1, 13))
    assert set(log.records[0].phases_s) == {"rollout", "weight_sync", "old_logprob", "update"}
    s = R.summary(log, skip_warmup=1)
    for ph, v in truth["phases_s"].items():
        assert s["phases_s"][ph] == pytest.approx(v, rel=0.05), ph  # medians of 11 steps of 3% noise
    assert s["response_len_mean"] == pytest.approx(truth["response_len_mean"], rel=0.02)
    assert s["prompt_len_mean"] == pytest.approx(truth["prompt_len_mean"], abs=1)
    # the raw timers are kept under NeMo-RL's names; the nested refit timer is not a phase
    assert "prepare_for_generation/transfer_and_update_weights" not in log.records[0].timing_s


def test_console_table_reads_the_same_numbers(logs):
    tb = R.read_log(next((logs / "run_b").rglob("events.out.tfevents*")))
    con = R.read_log(logs / "run_b.console.log")
    assert con.format == L.FORMAT_CONSOLE
    assert [r.step for r in con.records] == [r.step for r in tb.records]
    for a, b in zip(con.records, tb.records):
        for ph in b.phases_s:
            assert a.phases_s[ph] == pytest.approx(b.phases_s[ph], abs=0.006)  # the table prints 2 decimals
        assert a.step_s == pytest.approx(b.step_s, abs=0.006)
        assert a.response_len_mean == pytest.approx(b.response_len_mean, abs=1e-3)


def test_calibrate_recovers_the_synthetic_truth(logs, tmp_path, capsys):
    argv = ["calibrate"]
    for n in "abc":
        argv += ["--from-log", str(logs / f"run_{n}")]
    for n in "abc":
        argv += ["--launch", str(FIX / f"recipe_{n}.yaml")]
    out = tmp_path / "cal.json"
    assert main([*argv, "--out", str(out), "--json", "--params", TRUTH_KNOBS]) == 0
    res = json.loads(capsys.readouterr().out)
    truth = json.loads((logs / "truth.json").read_text())
    sigma = 100 * truth["noise_sigma"]
    before, after = res["phase_mape_before_pct"], res["phase_mape_after_pct"]
    assert set(before) == {"rollout", "weight_sync", "old_logprob", "update", "step"}  # NeMo-RL's phases
    for ph in before:
        assert after[ph] <= sigma, (ph, after[ph])
        assert before[ph] >= 3 * sigma, (ph, before[ph])
    p, k = res["params"], truth["knobs"]
    for name in ("compute_efficiency_scale", "rollout_efficiency_scale"):
        assert p[name] == pytest.approx(k[name], rel=0.06), name
    for name in ("weight_sync_overhead_s", "step_overhead_s"):
        assert p[name] == pytest.approx(k[name], abs=1.5), name
    # comm_efficiency_scale is not asserted: three one-node plans barely exercise communication
    assert all(d["format"] == L.FORMAT_TB for d in res["logs"])


def test_fold_is_nemo_rl_s(logs):
    """Old and reference log-probs are one NeMo-RL timer, refit and offload another: the prediction folds so."""
    lp = R.log_point(R.read_log(logs / "run_a"), FIX / "recipe_a.yaml")
    assert lp.fold == L.FOLD
    _, pred = R.predict_folded(defaults(), lp.point, lp.fold)
    assert "ref_logprob" not in pred and "offload" not in pred
    _, verl = R.predict_folded(defaults(), lp.point)
    assert pred["old_logprob"] == pytest.approx(verl["old_logprob"] + verl["ref_logprob"])


def test_a_log_without_nemo_rl_timing_is_a_coded_error(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(tmp_path / "tb"))
    w.add_scalar("train/loss", 0.5, 1)
    w.close()
    assert (
        main(
            [
                "calibrate",
                "--from-log",
                str(tmp_path / "tb"),
                "--launch",
                str(FIX / "recipe_a.yaml"),
                "--out",
                str(tmp_path / "c.json"),
            ]
        )
        == 2
    )
    assert "timing/train" in capsys.readouterr().err
