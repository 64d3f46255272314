"""grpo-tune tune: on our examples and on our renditions of verl's 7B and Qwen3-30B-A3B examples, the tuned
script passes `bash -n`, composes against verl 0.9.1's Hydra config, changes only the overrides it reports,
and tuning it again proposes no change (a fixed point)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_tune.autotune import tune as T
from grpo_tune.frameworks import read_plan
from grpo_tune.frameworks.verl.launch import read_launch
from grpo_tune.frameworks.verl.script import parse_value_str, tuned_text
from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl.diagnose import diagnose_path, parse_override_list, parse_script
from _verl_logs import calibrate_from_fixture_logs
from grpo_tune.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
LAUNCHES = [(p, "h100") for p in sorted((ROOT / "examples").glob("*.sh"))] + [
    (ROOT / "examples/verl-upstream/qwen2-7b-math-megatron.sh", "h100"),
    (ROOT / "examples/verl-upstream/qwen3moe-30b-megatron-96gb.sh", "h20"),
]
BASH = shutil.which("bash")


def _tune(capsys, path: Path, hw: str, out: Path, *extra: str) -> dict:
    rc = main(["tune", str(path), "--hardware", hw, "--out", str(out), "--json", *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


def _overrides(path: Path) -> dict[str, str]:
    ovs, _, _ = parse_script(path.read_text())
    return {o.key: o.raw for o in ovs}


@pytest.fixture(scope="module")
def hydra_config(tmp_path_factory):
    """verl 0.9.1's config folder (a local wheel in /tmp/verlwheel or $GRPO_TUNE_VERL_WHEEL, else PyPI)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GRPO_TUNE_CACHE", str(tmp_path_factory.mktemp("cache")))
    local = sorted(Path("/tmp/verlwheel").glob("verl-0.9.1-*.whl"))
    if not os.environ.get("GRPO_TUNE_VERL_WHEEL") and local:
        mp.setenv("GRPO_TUNE_VERL_WHEEL", str(local[0]))
    cdir = verl.config_dir(fetch=True)
    yield cdir
    mp.undo()


@pytest.mark.parametrize("launch,hw", LAUNCHES, ids=[p.name for p, _ in LAUNCHES])
def test_tune_diff_applies_and_is_a_fixed_point(capsys, tmp_path, launch, hw, hydra_config):
    first = _tune(capsys, launch, hw, tmp_path / "a")
    assert {"step_s", "fits"} <= set(first["current"]) and {"step_s", "fits"} <= set(first["best"])
    tuned = Path(first["files"]["tuned.sh"])
    assert tuned.parent == Path(first["run_dir"]) and (tuned.parent / "best.yaml").is_file()
    if BASH:
        r = subprocess.run([BASH, "-n", str(tuned)], check=False, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    # only the reported overrides change; every other line is byte for byte the user's
    before, after = _overrides(launch), _overrides(tuned)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == set(first["overrides"])
    for k, v in first["overrides"].items():
        assert parse_value_str(after[k]) == v["new"]
    old_lines = launch.read_text().splitlines()
    new_lines = tuned.read_text().splitlines()
    untouched = [ln for ln in old_lines if not any(k + "=" in ln for k in first["overrides"])]
    assert all(ln in new_lines for ln in untouched)
    added = [ln for ln in new_lines if ln not in old_lines]  # and nothing but the reported keys is written
    assert all(any(k + "=" in ln for k in first["overrides"]) for ln in added), added
    assert len(new_lines) - len(old_lines) == len(set(first["overrides"]) - set(before))
    # verl 0.9.1 accepts the tuned overrides
    ovs, _, _ = parse_script(tuned.read_text())
    tree = verl.compose([f"{o.prefix}{o.key}={o.raw}" for o in ovs])
    flat = verl.flatten(tree)
    for k, v in first["overrides"].items():  # each reported value is what verl composes
        assert flat[k] == v["new"], (k, flat[k], v["new"])
    meg = tree["actor_rollout_ref"]["actor"]["megatron"]
    assert meg["tensor_model_parallel_size"] == first["best"]["strategy"]["tp"]
    assert meg["pipeline_model_parallel_size"] == first["best"]["strategy"]["pp"]
    assert tree["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == first["best"]["strategy"]["rollout_tp"]
    # tuned.sh passes diagnose (no finding verl would refuse the launch for)
    rep = diagnose_path(tuned, hardware=hw)
    assert not rep.has_errors, [f.message for f in rep.findings if f.severity == "error"]
    # the plan we print is the plan the tuned script runs, and tuning it again changes nothing
    second = _tune(capsys, tuned, hw, tmp_path / "b")
    assert second["overrides"] == {}
    assert second["current"]["strategy"] == first["best"]["strategy"]
    assert second["current"]["step_s"] == pytest.approx(first["best"]["step_s"], rel=1e-9)


def test_keep_pins_the_fields(capsys, tmp_path):
    launch = ROOT / "examples/qwen2-7b-grpo-megatron.sh"
    res = _tune(capsys, launch, "h100", tmp_path, "--keep", "tp,pp")
    assert res["best"]["strategy"]["tp"] == res["current"]["strategy"]["tp"]
    assert not any(
        k.endswith(("tensor_model_parallel_size", "pipeline_model_parallel_size")) and "rollout" not in k
        for k in res["overrides"]
    )


def test_estimate_flags_pin_the_search(capsys, tmp_path):
    launch = ROOT / "examples/qwen2-7b-grpo-megatron.sh"
    res = _tune(capsys, launch, "h100", tmp_path, "--tp", "4", "--rollout-tp", "4", "--no-emit")
    assert res["best"]["strategy"]["tp"] == 4 and res["best"]["strategy"]["rollout_tp"] == 4
    assert res["overrides"]["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"]["new"] == 4


def test_launch_that_does_not_parse_is_a_coded_error(capsys, tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\npython3 -m verl.trainer.main_ppo data.train_batch_size='unclosed \\\n")
    assert main(["tune", str(bad), "--out", str(tmp_path)]) == 2
    assert "[BAD_CONFIG]" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    assert main(["tune", str(empty), "--out", str(tmp_path)]) == 2
    nomodel = tmp_path / "o.txt"
    nomodel.write_text("actor_rollout_ref.model.path=/nowhere/unknown-model\ndata.train_batch_size=8\n")
    assert main(["tune", str(nomodel), "--out", str(tmp_path)]) == 2
    assert "[UNKNOWN_MODEL]" in capsys.readouterr().err
    assert main(["tune", str(tmp_path / "missing.sh")]) == 2


def test_current_plan_that_does_not_fit_says_which_phase_and_nearest_fits(capsys, tmp_path):
    res = _tune(capsys, ROOT / "examples/verl-upstream/qwen3moe-30b-megatron-96gb.sh", "h100", tmp_path)
    if res["current"]["fits"]:
        pytest.skip("the cost model fits this plan on H100 now")
    assert res["current"]["oom"] and res["current"]["oom"][0]["phase"]
    assert res["best"]["fits"] and res["nearest_fit"]
    assert all(p["fits"] for p in res["nearest_fit"])


def test_the_gpu_a_launch_is_priced_on_is_stated_when_assumed(capsys):
    """A verl launch does not name its GPU: without --hardware, tune prices it on the default and says so (on
    stderr, beside the other notes); with --hardware, no such note."""
    launch = str(ROOT / "examples/verl-upstream/qwen2-7b-math-megatron.sh")
    assert main(["tune", launch, "--no-emit"]) == 0
    got = capsys.readouterr()
    err = " ".join(got.err.split())
    assert "priced on h100-sxm-80gb: the launch does not say which GPU it runs on (--hardware h100 assumed)" in err
    assert "on 8 x h100-sxm-80gb" in " ".join(got.out.split())
    assert main(["tune", launch, "--hardware", "h20", "--no-emit"]) == 0
    got = capsys.readouterr()
    assert "does not say which GPU" not in got.err and "on 8 x h20-96gb" in " ".join(got.out.split())


def test_a_plan_that_cannot_fit_names_the_phase_the_overshoot_and_the_nearest_fits(capsys, tmp_path):
    """Qwen2.5-7B on 8 x H100, TP1, micro-batch 8 of 4096+4096-token sequences, no recompute: the update's
    activations alone are far past 80 GB (Korthikanti: ~34 B x tokens x hidden per layer), so the current plan
    cannot fit whatever the memory model's details (no skip), while smaller micro-batches with TP do."""
    launch = tmp_path / "oom.txt"
    launch.write_text(
        "\n".join(
            [
                "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
                "data.train_batch_size=64",
                "data.max_prompt_length=4096",
                "data.max_response_length=4096",
                "actor_rollout_ref.rollout.n=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
                "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "trainer.n_gpus_per_node=8",
                "trainer.nnodes=1",
            ]
        )
        + "\n"
    )
    res = _tune(capsys, launch, "h100", tmp_path / "j")
    cur = res["current"]
    assert cur["fits"] is False and cur["oom"]
    assert all(o["phase"] and o["bytes_over"] > 0 for o in cur["oom"])
    assert "update" in {o["phase"] for o in cur["oom"]}
    assert cur["peak_gib"] > 80 and cur["headroom_gib"] < 0
    assert res["best"]["fits"] is True and res["overrides"]
    assert 1 <= len(res["nearest_fit"]) <= 3 and all(p["fits"] for p in res["nearest_fit"])
    # the text names each overflowing phase and its overshoot, and lists the nearest plans that fit
    assert main(["tune", str(launch), "--hardware", "h100", "--no-emit"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for o in cur["oom"]:
        assert f"the current plan does not fit: {o['phase']} needs {o['bytes_over'] / 2**30:.1f} GiB more" in text
    assert "nearest plans that fit:" in text
    for p in res["nearest_fit"]:
        row = p["plan"]
        assert f"{row['degrees']} {row['mbs']} recompute {row['recompute']} offload {row['offload']}" in text


def test_the_search_prices_plans_with_the_launchs_engine_knobs():
    """tune keeps the user's engine knobs (CPU optimizer, vLLM max_num_seqs, ...), so its search must rank plans
    with them: searched with other knobs, its shortlist filled with variants that collapse to one plan once the
    user's knobs are put back, and the best plan (equally fast, 5.7 GiB more headroom) was missed."""
    from grpo_tune.autotune.search.rank import rank_key
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.autotune.tune import PINNED as ENGINE_KEYS

    plan = read_plan(ROOT / "examples/qwen2-7b-grpo-megatron.sh", hardware="h100")
    res = T.tune(plan)
    engine = {k: plan.strategy.knob(k) for k in ENGINE_KEYS}
    direct = search(plan.model, plan.hardware, plan.cluster, plan.workload, pins=engine, top=10, min_headroom=0.05)
    for e in [res.best, *res.ranked]:
        assert {k: e.strategy.knob(k) for k in ENGINE_KEYS} == engine
    assert rank_key(res.best) <= rank_key(direct.ranked[0])


def test_calibration_from_logs_applies_to_tune(capsys, tmp_path):
    fix = ROOT / "tests/fixtures/verl_logs"
    cal = tmp_path / "cal.json"
    assert calibrate_from_fixture_logs(fix, cal) == 0
    capsys.readouterr()
    lens = ["--response-len-mean", "412", "--prompt-len-mean", "234"]  # what run_a logged (make_fixtures.py)
    plain = _tune(capsys, fix / "launch_a.txt", "h100", tmp_path / "p", "--no-emit", *lens)
    calibrated = _tune(
        capsys, fix / "launch_a.txt", "h100", tmp_path / "c", "--no-emit", "--calibration", str(cal), *lens
    )
    # the calibrated model reproduces what run_a logged (its medians after the warm-up step)
    from grpo_tune.autotune.calibrate import runlog

    logged = runlog.summary(runlog.read_log(fix / "run_a.jsonl"), skip_warmup=1)["phases_s"]
    assert calibrated["current"]["phases_s"]["rollout"] == pytest.approx(logged["rollout"], rel=0.06)
    assert calibrated["current"]["phases_s"]["update"] + calibrated["current"]["phases_s"].get(
        "offload", 0
    ) == pytest.approx(logged["update"], rel=0.06)
    assert plain["current"]["step_s"] > 0  # priced without the file too
    assert main(["tune", str(fix / "launch_a.txt"), "--hardware", "h100", "--no-emit", *lens]) == 0
    # the header says what was priced
    assert "prompt <= 1024 (mean 234) + response <= 2048 (mean 412) tokens" in capsys.readouterr().out
    assert main(["tune", str(fix / "launch_a.txt"), "--calibration", str(cal), "--hardware", "h200", "--no-emit"]) == 2
    assert "[BAD_CONFIG]" in capsys.readouterr().err  # fitted on other hardware


_VALUES = st.one_of(
    st.integers(0, 64),
    st.booleans(),
    st.none(),
    st.sampled_from(["full", "it's", "a b", "$X"]),
    st.floats(0.05, 0.95).map(lambda x: round(x, 2)),
)
_KEYS = [
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "data.train_batch_size",
    "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity",
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size",
    "trainer.nnodes",
    "actor_rollout_ref.ref.megatron.context_parallel_size",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(launch=st.sampled_from([p for p, _ in LAUNCHES]), changes=st.dictionaries(st.sampled_from(_KEYS), _VALUES))
def test_tuned_text_changes_exactly_the_given_overrides(tmp_path, launch, changes):
    lt = read_launch(launch)
    text = tuned_text(lt, {k: (lt.get(k), v) for k, v in changes.items()})
    out = tmp_path / "t.sh"
    out.write_text(text)
    if BASH:
        assert subprocess.run([BASH, "-n", str(out)], check=False, capture_output=True).returncode == 0
    after = {o.key: o for o in parse_script(text)[0]}
    before = {o.key: o for o in lt.overrides}
    from grpo_tune.frameworks.verl.script import runtime_values

    runtime = {k for k, _src, _new in runtime_values(lt, {k: (lt.get(k), v) for k, v in changes.items()})}
    for k, v in changes.items():
        if k in runtime:  # `$TP`, `$(...)`: computed when the launch runs, left as written (tune says what to set)
            assert after[k].raw == before[k].raw, (k, after[k])
            continue
        assert after[k].value == v or (isinstance(v, str) and after[k].raw == v), (k, v, after[k])
    for k, o in before.items():
        if k not in changes:
            assert after[k].raw == o.raw
    assert set(after) == set(before) | set(changes)


def _typo_launch(tmp_path: Path) -> Path:
    src = (ROOT / "examples/qwen2-7b-grpo-megatron.sh").read_text()
    key = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"
    assert key + "=" in src
    p = tmp_path / "typo.sh"
    p.write_text(src.replace(key, key.replace("pipeline", "pipline")))
    return p


def test_an_unknown_key_stops_tune_with_diagnoses_finding_and_writes_no_tuned_sh(capsys, tmp_path):
    """A misspelt key was "tuned" with exit 0 and kept in tuned.sh, which diagnose then refused: tune now reports
    it as diagnose does (with the did-you-mean), exits 1 and writes nothing, unless --ignore-unknown."""
    launch = _typo_launch(tmp_path)
    out = tmp_path / "runs"
    assert main(["tune", str(launch), "--out", str(out)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "UNKNOWN_KEY" in err and "pipline_model_parallel_size does not exist in verl 0.9.1" in err
    assert "did you mean actor_rollout_ref.actor.megatron.pipeline_model_parallel_size?" in err
    assert "--ignore-unknown" in err
    assert not out.exists() or not list(out.rglob("tuned.sh"))
    assert main(["tune", str(launch), "--out", str(out), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["tuned"] is False and {f["code"] for f in doc["findings"]} == {"UNKNOWN_KEY"}
    # --ignore-unknown: tuned, the refused key dropped (and said so), and tuned.sh passes diagnose
    res = _tune(capsys, launch, "h100", out, "--ignore-unknown")
    tuned = Path(res["files"]["tuned.sh"])
    text = tuned.read_text()
    assert "pipline_model_parallel_size=" not in text and "# grpo-tune tune: dropped" in text
    if BASH:
        assert subprocess.run([BASH, "-n", str(tuned)], check=False).returncode == 0
    rep = diagnose_path(tuned)
    assert not rep.has_errors, [f.message for f in rep.findings]
    assert main(["diagnose", str(tuned)]) == 0


def test_blog_only_keys_are_priced_as_the_real_ones_and_rewritten(capsys, tmp_path, hydra_config):
    """examples/broken/unknown-keys.overrides sets algorithm.group_size=8 and training.batch_size=512 (blog keys):
    tune priced it as verl's defaults (n=1, 1024 prompts) without a word, and megatron.grad_offload (not a 0.9.1
    key) passed silently. Now: exit 1 without --ignore-unknown; with it, n=8 and 512 prompts are priced, a
    warning names each key and its real twin, and tuned.sh writes the real keys, which verl 0.9.1 composes."""
    src = ROOT / "examples/broken/unknown-keys.overrides"
    assert main(["tune", str(src), "--no-emit"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    for key in ("algorithm.group_size", "training.batch_size", "megatron.grad_offload", "kl_coeff"):
        assert f"{key}" in err and "does not exist in verl 0.9.1" in err
    plan = read_plan(src)
    assert (plan.workload.n, plan.workload.prompts) == (8, 512)
    assert "param" in plan.strategy.memory.offload  # grad_offload=True read as param_offload=True
    res = _tune(capsys, src, "h100", tmp_path / "r", "--ignore-unknown")
    tuned = Path(res["files"]["tuned.sh"])
    ovs, _ = parse_override_list(tuned.read_text())
    keys = {o.key: o.raw for o in ovs}
    assert keys["actor_rollout_ref.rollout.n"] == "8" and keys["data.train_batch_size"] == "512"
    assert not {"algorithm.group_size", "training.batch_size"} & set(keys)
    assert not any(k.endswith(("grad_offload", "kl_coeff")) for k in keys)
    rep = diagnose_path(tuned)
    assert not rep.has_errors, [f.message for f in rep.findings]
    assert rep.summary["batch"]["n"] == 8
    flat = verl.flatten(verl.compose([f"{o.prefix}{o.key}={o.raw}" for o in ovs]))
    assert flat["actor_rollout_ref.rollout.n"] == 8 and flat["data.train_batch_size"] == 512


def test_diagnose_reads_blog_keys_as_their_real_twins_in_its_summary():
    """diagnose reports algorithm.group_size as an error (Hydra refuses it) and its summary now shows the group
    size the user meant (n=8), as tune prices it, not verl's default n=1."""
    rep = diagnose_path(ROOT / "examples/broken/unknown-keys.overrides")
    assert "UNKNOWN_KEY" in rep.codes("error")
    assert rep.summary["batch"]["n"] == 8 and rep.summary["batch"]["train_batch_size"] == 512


def test_tuned_sh_appears_with_its_run_folder_not_after_it(tmp_path, monkeypatch, capsys):
    """tuned.sh was written after the run folder was renamed into place: a kill between the two left a folder
    without it. It is now one of the staged files: at the moment of the rename the staged folder holds it,
    with the launch's own permission bits."""
    import os as _os

    launch = tmp_path / "run.sh"
    launch.write_text((ROOT / "examples/qwen2-7b-grpo-megatron.sh").read_text())
    launch.chmod(0o750)
    seen: list[list[str]] = []
    real_rename = _os.rename

    def rename(src, dst):
        if Path(src).name.endswith(".partial"):
            seen.append(sorted(p.name for p in Path(src).iterdir()))
        return real_rename(src, dst)

    monkeypatch.setattr(_os, "rename", rename)
    assert main(["tune", str(launch), "--hardware", "h100", "--out", str(tmp_path / "runs"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert seen and "tuned.sh" in seen[0], seen
    tuned = Path(doc["files"]["tuned.sh"])
    assert tuned.parent.parent == tmp_path / "runs" and tuned.stat().st_mode & 0o777 == 0o750


def test_stack_prices_the_launch_under_that_stack(capsys, tmp_path):
    """--stack changes the host and engine costs tune prices: the same launch under NeMo-RL v0.3's stack
    (bf16 gradient reduction, its micro-batch and wake costs) is priced as estimate prices that plan there;
    an unknown stack is a coded error."""
    from grpo_tune.core.specs import load_hardware
    from grpo_tune.costmodel.estimate import estimate

    launch = ROOT / "examples/qwen2-7b-grpo-megatron.sh"
    verl_res = _tune(capsys, launch, "h100", tmp_path, "--no-emit")
    nemo_res = _tune(capsys, launch, "h100", tmp_path, "--no-emit", "--stack", "nemo-rl-v0.3")
    assert nemo_res["current"]["step_s"] != pytest.approx(verl_res["current"]["step_s"], rel=0.01)
    plan = read_plan(launch, hardware="h100", stack="nemo-rl-v0.3")
    assert plan.hardware.stack == "nemo-rl-v0.3"
    assert plan.hardware.efficiency == load_hardware("h100", stack="nemo-rl-v0.3").efficiency
    e = estimate(
        model=plan.model, hardware=plan.hardware, cluster=plan.cluster, strategy=plan.strategy, workload=plan.workload
    )
    assert nemo_res["current"]["step_s"] == pytest.approx(e.step_s, rel=1e-3)
    rc = main(["tune", str(launch), "--hardware", "h100", "--no-emit", "--stack", "no-such-stack"])
    err = capsys.readouterr().err
    assert rc == 2 and "[BAD_CONFIG]" in err and "unknown stack" in err
