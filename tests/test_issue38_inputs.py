"""Issue 38, items 3-4: diagnose and tune read verl's pipeline split the same way and word degree errors in the
framework's own terms; the NeMo-RL placement display; no Python warning from NeMo-RL's resolvers; the confusing
inputs (a document, a folder, a shell script given to train, contradictory flags) are coded errors, and ``-h`` /
``--version`` work. Each test here failed on the code before the issue."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from grpo_tune.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
Q235 = ROOT / "examples" / "verl-upstream" / "qwen3-235b-megatron-96gb.sh"
NEMO = ROOT / "examples" / "nemo-rl-upstream"
ASYNC = NEMO / "grpo-qwen3-30ba3b-4n8g-async-1off.yaml"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _errors(capsys, *argv: str) -> list[dict]:
    rc, out, err = _run(capsys, "diagnose", *argv, "--json")
    assert rc in (0, 1), err
    return [f for f in json.loads(out)["findings"] if f["severity"] == "error"]


# -- diagnose = tune on the layer split ---------------------------------------------------------------


def test_diagnose_reads_the_account_for_keys_as_tune_does(capsys):
    """verl's Qwen3-235B example splits 94 layers over pp=8 with account_for_embedding/loss_in_pipeline_split
    (96 / 8 = 12 a stage): diagnose said pp=8 does not divide the layers, while tune priced it as fitting."""
    assert not [f for f in _errors(capsys, str(Q235), "--hardware", "h20") if f["code"] == "INVALID_DEGREES"]


def test_the_235b_tuned_sh_passes_diagnose(capsys, tmp_path):
    rc, out, err = _run(capsys, "tune", str(Q235), "--hardware", "h20", "--out", str(tmp_path), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["current"]["fits"]
    assert _errors(capsys, d["files"]["tuned.sh"], "--hardware", "h20") == []


def test_a_split_pp_cannot_make_names_the_role_and_verls_keys(capsys, tmp_path):
    text = Q235.read_text().replace("pipeline_model_parallel_size=8", "pipeline_model_parallel_size=4")
    text = "\n".join(ln for ln in text.splitlines() if "account_for" not in ln) + "\n"
    f = tmp_path / "pp4.sh"
    f.write_text(text)
    (e,) = [x for x in _errors(capsys, str(f), "--hardware", "h20") if x["code"] == "INVALID_DEGREES"]
    assert e["message"].startswith("actor (and ref): pp=4 does not divide the 94 layers")
    assert "--first-stage-layers" not in e["hint"]
    assert "override_transformer_config.num_layers_in_first_pipeline_stage" in e["hint"]
    assert "account_for_embedding_in_pipeline_split" in e["hint"]


def test_a_nemo_rl_split_names_the_policy_and_its_keys(capsys, tmp_path):
    f = tmp_path / "pp32.yaml"
    f.write_text(
        f"defaults: {NEMO / 'grpo-qwen3-30ba3b-4n8g.yaml'}\npolicy:\n  megatron_cfg:\n"
        "    pipeline_model_parallel_size: 32\n"
    )
    (e,) = [x for x in _errors(capsys, str(f)) if x["code"] == "INVALID_DEGREES"]
    assert e["message"] == "policy: pp=32 does not divide the 48 layers of qwen3-30b-a3b"
    assert "policy.megatron_cfg.num_layers_in_first_pipeline_stage" in e["hint"] and "--" not in e["hint"]


# -- the NeMo-RL display and warning -------------------------------------------------------------------


def test_nemo_rl_separate_pools_are_shown_with_their_sizes(capsys):
    rc, out, err = _run(capsys, "diagnose", str(ASYNC), "--json")
    assert rc == 0, err
    pl = json.loads(out)["summary"]["placement"]
    assert (pl["rollout_gpus"], pl["rollout_gpus_per_node"], pl["train_gpus"]) == (16, 8, 16)
    assert "NeMo-RL" in pl["trainer"]
    rc, out, _ = _run(capsys, "diagnose", str(ASYNC))
    text = " ".join(out.split())
    assert "None" not in text and "verl fully-async" not in text
    assert "32 GPUs; training pool 16 GPUs" in text


def test_search_output_for_nemo_rl_does_not_speak_of_verls_idle_ratio(capsys, tmp_path):
    rc, out, err = _run(
        capsys,
        *("search", "--model", "qwen2.5-7b", "--gpus", "16", "--framework", "nemo-rl"),
        *("--placement", "auto", "--staleness", "1", "--no-emit"),
    )
    assert rc == 0, err
    assert "idle_ratio" not in out


def test_no_python_warning_from_nemo_rls_resolvers(capsys, monkeypatch):
    """An OmegaConf that calls register_new_resolver deprecated warned on every NeMo-RL command (recipe.py:142)."""
    from omegaconf import OmegaConf

    real = OmegaConf.register_new_resolver

    def deprecated(*a, **k):
        warnings.warn("register_new_resolver() is deprecated", UserWarning, stacklevel=2)
        return real(*a, **k)

    for name in ("mul", "div", "max"):
        if OmegaConf.has_resolver(name):
            OmegaConf.clear_resolver(name)
    monkeypatch.setattr(OmegaConf, "register_new_resolver", staticmethod(deprecated))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc, _, err = _run(capsys, "diagnose", str(ASYNC), "--json")
    assert rc == 0, err
    assert "Warning" not in err


# -- inputs that confused ---------------------------------------------------------------------------------


def test_version_and_short_help(capsys):
    from grpo_tune import __version__

    rc, out, _ = _run(capsys, "--version")
    assert rc == 0 and out.strip() == f"grpo-tune {__version__}"
    rc, out, _ = _run(capsys, "-h")
    assert rc == 0 and "Usage: grpo-tune" in out
    rc, out, _ = _run(capsys, "tune", "-h")
    assert rc == 0 and "Usage: grpo-tune tune" in out


def test_contradictory_flags_are_refused(capsys, tmp_path):
    rc, _, err = _run(capsys, "tune", str(ROOT / "examples" / "qwen2-7b-grpo-megatron.sh"), "--emit", "--no-emit")
    assert rc == 2 and "[USAGE]" in err and "--emit and --no-emit contradict" in err


@pytest.mark.parametrize("cmd", ["diagnose", "tune"])
def test_a_document_is_not_a_launch(capsys, cmd):
    rc, _, err = _run(capsys, cmd, str(ROOT / "README.md"))
    assert rc == 2 and "[BAD_CONFIG]" in err and "is a Markdown document, not a launch" in err


def test_prose_without_a_suffix_is_not_an_override_list(capsys, tmp_path):
    f = tmp_path / "notes"
    f.write_text("We ran it with tp=2 and it was fine.\nNext time: try pp=2 instead.\nThe end.\n")
    rc, _, err = _run(capsys, "diagnose", str(f))
    assert rc == 2 and "is not a launch" in err


@pytest.mark.parametrize("cmd", ["diagnose", "tune"])
def test_a_folder_is_said_to_be_a_folder(capsys, cmd):
    rc, _, err = _run(capsys, cmd, str(ROOT / "examples"))
    assert rc == 2 and "examples is a folder, not a launch" in err and "qwen2-7b-grpo-megatron.sh" in err


def test_train_with_a_shell_script_says_so(capsys):
    rc, _, err = _run(capsys, "train", "--config", str(ROOT / "examples" / "qwen2-7b-grpo-megatron.sh"))
    assert rc == 2 and "is a shell script (a launch), not a run config (a best.yaml)" in err
    assert "expected a mapping" not in err
