"""The verl launch script: bash runs it with the overrides intact, and diagnose reads it back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from grpo_tune.frameworks.verl.diagnose import diagnose_overrides, parse_script
from grpo_tune.frameworks.verl.export import verl_overrides, verl_script
from _export_configs import configs

BASH = shutil.which("bash")


def run_with_fake_python(script: str, tmp_path, env: dict[str, str], *extra: str) -> list[str]:
    """Run the script with a ``python3`` on PATH that records its arguments instead of training."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "python3"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(tmp_path / 'argv.json')!r}, 'w'))\n"
    )
    fake.chmod(0o755)
    path = tmp_path / "verl.sh"
    path.write_text(script)
    full_env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), **env}
    subprocess.run([BASH, str(path), *extra], check=True, env=full_env, timeout=30)
    return json.loads((tmp_path / "argv.json").read_text())


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("name", ["7b-tp2", "qwen3-30b-a3b-ep8", "32b-pp-vpp-uneven"])
def test_bash_passes_every_override(name, tmp_path):
    cfg = configs()[name]
    argv = run_with_fake_python(verl_script(cfg), tmp_path, {"MODEL_PATH": "/models/m"}, "trainer.save_freq=10")
    assert argv[:3] == ["-m", "verl.trainer.main_ppo", "--config-name=ppo_megatron_trainer"]
    want = verl_overrides(
        cfg,
        model_path="/models/m",
        train_files=f"{tmp_path}/data/gsm8k/train.parquet",
        val_files=f"{tmp_path}/data/gsm8k/test.parquet",
    )
    assert argv[3:] == want + ["trainer.save_freq=10"]


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_model_path_defaults_to_the_hf_id(tmp_path):
    cfg = configs()["moonlight-tp4-ep4-etp1"]
    argv = run_with_fake_python(verl_script(cfg), tmp_path, {})
    assert f"actor_rollout_ref.model.path={cfg.model.hf_id}" in argv


def test_no_grad_offload_and_no_blog_keys():
    for cfg in configs().values():
        keys = [o.split("=", 1)[0] for o in verl_overrides(cfg)]
        assert len(keys) == len(set(keys))
        assert not any("grad_offload" in k or k.startswith(("training.", "algorithm.group_size")) for k in keys)
        assert "actor_rollout_ref.rollout.n" in keys


@pytest.mark.parametrize("name", sorted(configs()))
def test_diagnose_reads_the_script_back(name):
    cfg = configs()[name]
    overrides, findings, facts = parse_script(verl_script(cfg))
    assert not findings and facts["commands"] == ["main_ppo"]
    rep = diagnose_overrides(overrides, model=cfg.model, hardware=cfg.hardware, findings=findings)
    s = cfg.strategy
    actor = rep.summary["roles"]["actor"]
    assert (actor["tp"], actor["pp"], actor["vpp"], actor["cp"], actor["ep"], actor["etp"], actor["dp"]) == (
        s.layout.tp,
        s.layout.pp,
        s.layout.vpp,
        s.layout.cp,
        s.layout.ep,
        s.layout.etp_,
        s.layout.dp,
    )
    assert rep.summary["roles"]["ref"] == actor
    assert rep.summary["roles"]["rollout"]["tp"] == s.rollout.rollout_tp
    assert rep.summary["world_size"] == cfg.cluster.gpus
    degree_codes = {
        "TP_MISMATCH",
        "PP_MISMATCH",
        "CP_MISMATCH",
        "EP_MISMATCH",
        "INVALID_DEGREES",
        "EXPERT_DEGREES",
        "EXPERT_IMBALANCE",
        "BATCH_DIVISIBILITY",
        "UNKNOWN_KEY",
        "DTYPE_CONFLICT",
        "BAD_CONFIG",
    }
    assert not rep.codes("error") & degree_codes, [f.to_dict() for f in rep.findings]
