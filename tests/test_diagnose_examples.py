"""diagnose on the shipped examples: the good launches have no errors, each broken one gives the
codes its ``# expect:`` line names; the CLI's exit codes and --json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_tune.cli.main import main
from grpo_tune.frameworks.verl.diagnose import diagnose_path

ROOT = Path(__file__).resolve().parent.parent
GOOD = sorted((ROOT / "examples").glob("*.sh"))
BROKEN = sorted(p for p in (ROOT / "examples" / "broken").iterdir() if p.suffix in (".sh", ".overrides"))


def expected(path: Path) -> set[str]:
    m = re.search(r"^# expect: (.+)$", path.read_text(), re.M)
    assert m, f"{path} has no '# expect:' line"
    return set(m.group(1).split())


def test_there_are_examples():
    assert len(GOOD) >= 4 and len(BROKEN) >= 8


@pytest.mark.parametrize("path", GOOD, ids=[p.name for p in GOOD])
def test_good_examples_have_no_errors(path):
    rep = diagnose_path(path)
    assert rep.count("error") == 0, [f.to_dict() for f in rep.findings if f.severity == "error"]
    assert rep.summary["model"] is not None, "each example's model maps to a preset"
    assert (
        rep.summary["memory"] is not None
        and rep.summary["memory"]["peak_bytes"] <= rep.summary["memory"]["capacity_bytes"]
    )
    roles = rep.summary["roles"]
    assert roles["ref"] == roles["actor"]


@pytest.mark.parametrize("path", BROKEN, ids=[p.name for p in BROKEN])
def test_broken_examples_give_their_codes(path):
    rep = diagnose_path(path)
    assert rep.has_errors
    assert expected(path) <= rep.codes(), (expected(path), rep.codes())


def test_moonlight_etp1_is_valid_but_etp4_is_not():
    good = diagnose_path(ROOT / "examples" / "moonlight-16b-a3b-grpo-megatron.sh")
    assert good.summary["roles"]["actor"]["etp"] == 1 and good.summary["roles"]["actor"]["tp"] == 4
    assert "EXPERT_DEGREES" not in good.codes()
    bad = diagnose_path(ROOT / "examples" / "broken" / "expert-degrees.sh")
    assert "EXPERT_DEGREES" in bad.codes("error")


def test_seed_keys_point_to_the_real_ones():
    rep = diagnose_path(ROOT / "examples" / "broken" / "seed-7b-verl-train.sh")
    hints = {f.key: f.hint for f in rep.findings if f.code == "UNKNOWN_KEY"}
    assert "actor_rollout_ref.rollout.n" in hints["algorithm.group_size"]
    assert "data.train_batch_size" in hints["training.batch_size"]
    assert "actor_rollout_ref.actor.kl_loss_coef" in hints["actor_rollout_ref.actor.kl_coeff"]
    assert "param_offload" in hints["actor_rollout_ref.actor.megatron.grad_offload"]
    moe = diagnose_path(ROOT / "examples" / "broken" / "seed-30b-moe.sh")
    lb = [f for f in moe.findings if f.key and f.key.endswith("moe_router_load_balance")]
    assert lb and "moe_router_load_balancing_type" in lb[0].hint
    # findings carry the physical line of the offending override
    grad = next(f for f in rep.findings if f.key == "actor_rollout_ref.actor.megatron.grad_offload")
    text = (ROOT / "examples" / "broken" / "seed-7b-verl-train.sh").read_text().splitlines()
    assert "grad_offload" in text[grad.line - 1]


def test_oom_names_phase_and_bytes():
    rep = diagnose_path(ROOT / "examples" / "broken" / "oom.sh")
    ooms = [f for f in rep.findings if f.code == "OOM_RISK" and f.severity == "error"]
    assert ooms and all(f.phase and f.bytes and f.bytes > 0 for f in ooms)


def test_rollout_tp_differing_from_actor_is_only_info():
    rep = diagnose_path(ROOT / "examples" / "qwen3-30b-a3b-grpo-megatron.sh")
    tp = [f for f in rep.findings if f.code == "TP_MISMATCH"]
    assert tp and all(f.severity == "info" for f in tp)


def test_a_tp_group_straddling_two_nodes_is_a_warning(tmp_path):
    """2 nodes of 6 GPUs with TP 4: ranks 4-7 form a TP group on two nodes. verl runs it (a warning, not an error),
    with TP's all-reduces on the network; TP 2 divides the node and is not flagged."""
    src = (ROOT / "examples" / "verl-upstream" / "qwen2-7b-math-megatron.sh").read_text()
    text = (
        src.replace("pipeline_model_parallel_size=2", "pipeline_model_parallel_size=1")
        .replace("n_gpus_per_node=8", "n_gpus_per_node=6")
        .replace("nnodes=1", "nnodes=2")
    )
    assert text != src
    two = tmp_path / "tp2.sh"
    two.write_text(text)
    four = tmp_path / "tp4.sh"
    four.write_text(text.replace("tensor_model_parallel_size=2", "tensor_model_parallel_size=4"))
    msgs = [f.message for f in diagnose_path(four).findings if f.code == "TP_MISMATCH" and f.severity == "warning"]
    assert any(m.startswith("actor TP=4 spans nodes of 6 GPUs") for m in msgs), msgs
    assert any(m.startswith("rollout TP=4 spans nodes of 6 GPUs") for m in msgs), msgs
    assert not [f for f in diagnose_path(two).findings if "spans nodes" in f.message]


def test_cli_exit_codes_and_json(capsys, tmp_path):
    assert main(["diagnose", str(GOOD[0])]) == 0
    out = capsys.readouterr().out
    assert "Parallel Config Summary" in out
    assert main(["diagnose", str(ROOT / "examples" / "broken" / "tp-mismatch.sh"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["errors"] >= 1 and {f["code"] for f in data["findings"]} >= {"TP_MISMATCH"}
    assert data["summary"]["roles"]["ref"]["tp"] == 4
    # bad input: coded error, exit 2, no traceback
    assert main(["diagnose", str(tmp_path / "missing.sh")]) == 2
    (tmp_path / "empty.sh").write_text("")
    assert main(["diagnose", str(tmp_path / "empty.sh")]) == 2
    (tmp_path / "bin.sh").write_bytes(b"\xff\xfe\x00\x81")
    assert main(["diagnose", str(tmp_path / "bin.sh")]) == 2
    (tmp_path / "prose.txt").write_text("just some words\n")
    assert main(["diagnose", str(tmp_path / "prose.txt")]) == 2
    err = capsys.readouterr().err
    assert "[BAD_CONFIG]" in err and "Traceback" not in err


def test_model_flag_when_the_path_maps_to_nothing(tmp_path):
    text = (
        (ROOT / "examples" / "qwen2-7b-grpo-megatron.sh")
        .read_text()
        .replace("Qwen/Qwen2-7B-Instruct", "/ckpt/my-finetune")
    )
    p = tmp_path / "x.sh"
    p.write_text(text)
    rep = diagnose_path(p)
    assert rep.summary["memory"] is None and "UNKNOWN_MODEL" in rep.codes("info")
    rep = diagnose_path(p, model="qwen2-7b")
    assert rep.summary["memory"] is not None and rep.summary["model"] == "qwen2-7b"
    # a local checkpoint folder with config.json is read
    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "num_hidden_layers": 28,
                "hidden_size": 3584,
                "intermediate_size": 18944,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "vocab_size": 152064,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0,
                "max_position_embeddings": 32768,
                "tie_word_embeddings": False,
            }
        )
    )
    p.write_text(text.replace("/ckpt/my-finetune", str(ck)))
    rep = diagnose_path(p)
    assert rep.summary["memory"] is not None, rep.summary["model_note"]


def test_fp16_actor_alone_warns_about_ref_and_rollout():
    from grpo_tune.frameworks.verl.diagnose import diagnose_overrides

    rep = diagnose_overrides(["actor_rollout_ref.actor.megatron.dtype=float16"])
    warned = {f.key for f in rep.findings if f.code == "DTYPE_CONFLICT" and f.severity == "warning"}
    assert warned == {"actor_rollout_ref.ref.megatron.dtype", "actor_rollout_ref.rollout.dtype"}
    rep = diagnose_overrides(
        [
            "actor_rollout_ref.actor.megatron.dtype=float16",
            "actor_rollout_ref.ref.megatron.dtype=float16",
            "actor_rollout_ref.rollout.dtype=float16",
        ]
    )
    assert "DTYPE_CONFLICT" not in rep.codes()
    rep = diagnose_overrides(
        [
            "+actor_rollout_ref.actor.megatron.override_transformer_config.fp16=True",
            "+actor_rollout_ref.actor.megatron.override_transformer_config.bf16=True",
        ]
    )
    assert "DTYPE_CONFLICT" in rep.codes("error")
