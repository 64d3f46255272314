"""diagnose reads a launch script as bash does, or says that it cannot (issue 14, defect 9), and reads
any input in bounded time and memory (defect 3). Each test failed on the regex/shlex reader it replaces."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from grpo_tune.frameworks.verl.diagnose import diagnose_path, parse_script
from grpo_tune.core.errors import GrpoTuneError

A = "actor_rollout_ref.actor.megatron"
HEAD = "#!/bin/bash\n"
CMD = "python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer"


def values(script: str) -> dict:
    ovs, _, _ = parse_script(script)
    return {o.key: o.value for o in ovs}


def run(tmp_path, script: str, name: str = "run.sh"):
    p = tmp_path / name
    p.write_bytes(script.encode())
    return diagnose_path(p)


def bash_argv(script: str) -> list[str]:
    """What bash itself passes to the command (a printf stands in for python3; nothing else runs)."""
    body = script.replace("python3 -m verl.trainer.main_ppo", "printf '%s\\0'")
    out = subprocess.run(["bash", "-c", body], capture_output=True, timeout=20, env={"PATH": os.environ["PATH"]})
    return [a.decode() for a in out.stdout.split(b"\0")[:-1]]


def test_arithmetic_and_nested_defaults_are_evaluated():
    script = (
        HEAD + f"B=2\n{CMD} {A}.tensor_model_parallel_size=$((1+1)) "
        f"{A}.pipeline_model_parallel_size=${{A:-${{B:-3}}}} {A}.context_parallel_size=${{C:-${{D:-1}}}}\n"
    )
    v = values(script)
    assert v[f"{A}.tensor_model_parallel_size"] == 2
    assert v[f"{A}.pipeline_model_parallel_size"] == 2
    assert v[f"{A}.context_parallel_size"] == 1


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_values_equal_what_bash_passes():
    script = (
        HEAD + "X=abc\nY=\n" + f"{CMD} a.b=$((6/4)) c.d=${{Y:-z}} e.f=${{Y-z}} 'g.h=$X' \"i.j=$X\" k.l=a\\ b "
        "m.n=${X:+set} o.p=$((-7/2)) q.r=$((7%3))\n"
    )
    got = [o for o in bash_argv(script) if "=" in o and not o.startswith("--")]
    ovs, _, _ = parse_script(script)
    assert [f"{o.key}={o.raw}" for o in ovs] == got


def test_command_substitution_is_not_guessed(tmp_path):
    rep = run(
        tmp_path, HEAD + f"{CMD} {A}.tensor_model_parallel_size=$(echo 4) trainer.n_gpus_per_node=8 trainer.nnodes=1\n"
    )
    key = f"{A}.tensor_model_parallel_size"
    mine = [f for f in rep.findings if f.key == key]
    assert mine and all(f.severity == "info" for f in mine), [f.to_dict() for f in mine]
    assert any("could not evaluate" in f.message for f in mine)


def test_backslash_space_ends_the_command(tmp_path):
    rep = run(tmp_path, HEAD + f"{CMD} \\\n  data.train_batch_size=64 \\ \n  {A}.tensor_model_parallel_size=2\n")
    errs = [f for f in rep.findings if f.severity == "error" and f.code == "BAD_CONFIG"]
    assert any("blank after the line-continuation backslash" in f.message for f in errs)
    assert any("own command" in f.message for f in errs)


def test_crlf_line_endings_are_an_error(tmp_path):
    rep = run(tmp_path, (HEAD + f"{CMD} \\\n  data.train_batch_size=64\n").replace("\n", "\r\n"))
    assert any(f.severity == "error" and "CRLF" in f.message for f in rep.findings)


def test_single_quoted_variable_reaches_verl_literally(tmp_path):
    script = HEAD + f"TP=4\n{CMD} '{A}.tensor_model_parallel_size=$TP'\n"
    assert values(script)[f"{A}.tensor_model_parallel_size"] == "$TP"
    rep = run(tmp_path, script)
    assert any("single quotes" in f.message for f in rep.findings)


def test_prefix_assignment_does_not_reach_the_arguments(tmp_path):
    script = HEAD + f"TP=4 {CMD} {A}.tensor_model_parallel_size=$TP\n"
    assert values(script)[f"{A}.tensor_model_parallel_size"] != 4
    rep = run(tmp_path, script)
    assert any(f.severity == "error" and "prefix assignment" in f.message for f in rep.findings)


def test_full_width_digits_are_not_numbers(tmp_path):
    rep = run(tmp_path, HEAD + f"{CMD} {A}.tensor_model_parallel_size=\uff14\n")
    assert any(f.severity == "error" and f.key == f"{A}.tensor_model_parallel_size" for f in rep.findings)


def test_duplicate_yaml_keys_are_reported(tmp_path):
    p = tmp_path / "verl.yaml"
    p.write_text("data:\n  train_batch_size: 64\n  train_batch_size: 128\n")
    rep = diagnose_path(p)
    assert any("appears twice" in f.message and f.line == 3 for f in rep.findings)


# --- defect 3: bounded reads -----------------------------------------------------------------------


def _refused_fast(path, limit_s: float = 10.0) -> GrpoTuneError:
    t0 = time.monotonic()
    with pytest.raises(GrpoTuneError) as exc:
        diagnose_path(path)
    assert time.monotonic() - t0 < limit_s
    return exc.value


def test_billion_laughs_yaml_is_refused(tmp_path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    p = tmp_path / "laughs.yaml"
    p.write_text("\n".join(lines) + "\n")
    assert p.stat().st_size < 1000
    assert "nodes" in _refused_fast(p).message


def test_deep_yaml_is_refused(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("[" * 5000 + "]" * 5000 + "\n")
    assert _refused_fast(p).code == "BAD_CONFIG"


def test_devices_and_fifos_are_not_read(tmp_path):
    assert "regular file" in _refused_fast("/dev/zero").message
    fifo = tmp_path / "pipe.sh"
    os.mkfifo(fifo)
    assert "regular file" in _refused_fast(fifo).message


def test_a_huge_single_line_is_refused_unread(tmp_path):
    p = tmp_path / "big.sh"
    p.write_bytes(b"#!/bin/bash\n" + b"x" * (10 * 1024 * 1024) + b"\n")
    assert "limit" in _refused_fast(p).message


def test_a_long_script_is_read_in_linear_time(tmp_path):
    """200k lines: one verl command continued over every line, each with its own key."""
    p = tmp_path / "long.sh"
    body = "".join(f" +t.x{i}=1 \\\n" for i in range(200_000))
    p.write_text(HEAD + f"{CMD} \\\n" + body + " data.train_batch_size=64\n")
    t0 = time.monotonic()
    rep = diagnose_path(p)
    assert time.monotonic() - t0 < 60  # seconds; ~10 s unloaded (the old reader was quadratic: many minutes)
    assert rep.summary["batch"]["train_batch_size"] == 64


def test_an_unclosed_quote_is_an_error(tmp_path):
    for script in (HEAD + f"{CMD} 'data.train_batch_size=8\n", HEAD + f'{CMD} "data.train_batch_size=8\n'):
        rep = run(tmp_path, script)
        assert any(f.severity == "error" and "never closes" in f.message and f.line == 2 for f in rep.findings)
    rep = run(tmp_path, HEAD + f"{CMD} \"data.train_batch_size=8\" 'trainer.nnodes=1'\n")
    assert not any("never closes" in f.message for f in rep.findings)


ARRAYS = (
    HEAD
    + "TP=4\n"
    + "DATA=(\n"
    + "    data.train_batch_size=128  # prompts per step\n"
    + "    'data.train_files=[\"a b.parquet\"]'\n"
    + ")\n"
    + "ACTOR=(\n"
    + f"    {A}.tensor_model_parallel_size=$TP\n"
    + "    # a commented-out element: actor_rollout_ref.actor.ppo_mini_batch_size=99\n"
    + f"    {A}.pipeline_model_parallel_size=1 \\\n"
    + "    actor_rollout_ref.actor.ppo_mini_batch_size=16\n"
    + ")\n"
    + "ACTOR+=(actor_rollout_ref.actor.use_dynamic_bsz=True)\n"
    + 'ALL=("${DATA[@]}" "${ACTOR[@]}")\n'
    + "python3 -m verl.trainer.main_ppo --config-name='ppo_megatron_trainer.yaml' \\\n"
    + '    "${ALL[@]}" \\\n'
    + "    actor_rollout_ref.rollout.n=4\n"
)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_arrays_expand_to_one_word_per_element_as_bash_does():
    """verl's LoRA and e2e scripts collect their overrides in bash arrays (``DATA=(...)``, ``"${DATA[@]}"``): each
    element is one argument, comments and line continuations inside the list are bash's, ``+=`` appends. The
    reader used to stop at the ``(`` and find no override at all."""
    got = [o for o in bash_argv(ARRAYS) if "=" in o and not o.startswith("--")]
    ovs, _, facts = parse_script(ARRAYS)
    assert [f"{o.key}={o.raw}" for o in ovs] == got
    assert len(got) == 7 and f"{A}.tensor_model_parallel_size=4" in got
    assert facts["config_name"] == "ppo_megatron_trainer"  # Hydra finds the same file with or without .yaml
    line = {o.key: o.line for o in ovs}
    assert line[f"{A}.tensor_model_parallel_size"] == 8  # findings point into the array, where the value is


def test_an_unset_array_is_said_not_guessed():
    ovs, findings, _ = parse_script(HEAD + f'{CMD} "${{NOPE[@]}}" {A}.tensor_model_parallel_size=2\n')
    assert [o.key for o in ovs] == [f"{A}.tensor_model_parallel_size"]
    assert [f.message for f in findings] == ['line 2: "${NOPE[@]}" expands to nothing: the script does not set NOPE']


def test_lora_and_other_rollout_engines_are_said_to_be_unpriced(tmp_path):
    """A LoRA launch is priced as full-parameter training and an engine other than vLLM and SGLang as vLLM: diagnose
    says so. SGLang, FP8 rollout (quantization=fp8) and FP8 training (fp8=e4m3) are priced (docs/precision.md):
    not said; other quantizations and FP8 formats are."""
    rep = run(
        tmp_path,
        HEAD + f"{CMD} actor_rollout_ref.model.lora.rank=64 actor_rollout_ref.rollout.name=trtllm "
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B\n",
    )
    msgs = [f.message for f in rep.findings if f.code == "NOT_PRICED"]
    assert len(msgs) == 2, [f.to_dict() for f in rep.findings]
    assert "LoRA is not priced" in msgs[0] and "priced as vLLM's" in msgs[1]
    sgl = run(tmp_path, HEAD + f"{CMD} actor_rollout_ref.rollout.name=sglang\n", name="sglang.sh")
    assert not [f for f in sgl.findings if f.code == "NOT_PRICED"]
    fp8 = run(
        tmp_path,
        HEAD + f"{CMD} actor_rollout_ref.rollout.quantization=fp8 +{A}.override_transformer_config.fp8=e4m3\n",
        name="fp8.sh",
    )
    assert not [f for f in fp8.findings if f.code == "NOT_PRICED"], [f.to_dict() for f in fp8.findings]
    other = run(
        tmp_path,
        HEAD + f"{CMD} actor_rollout_ref.rollout.quantization=awq +{A}.override_transformer_config.fp8=e5m2\n",
        name="other.sh",
    )
    said = [f.message for f in other.findings if f.code == "NOT_PRICED"]
    assert len(said) == 2 and "quantized rollout is priced as bf16" in said[0] and "FP8 format" in said[1], said
    plain = run(tmp_path, HEAD + f"{CMD} actor_rollout_ref.rollout.name=vllm\n", name="plain.sh")
    assert not [f for f in plain.findings if f.code == "NOT_PRICED"]


@pytest.mark.parametrize(
    "body, words",
    [
        ("X=ab\n" + 'X="$X$X"\n' * 40 + f"{CMD} a.b=$X\n", "expands past 1,048,576 characters"),
        ("A=(a b)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40 + f'{CMD} "${{A[@]}}"\n', "array A passes 100,000"),
        ("A=(" + " x" * 50_000 + ")\n" + CMD + ' "${A[@]}"' * 300 + "\n", "a command passes 100,000 arguments"),
        (f"{CMD} a.b=" + "${A:-" * 5000 + "x" + "}" * 5000 + "\n", "nests its expansions too deeply"),
    ],
    ids=["a doubling variable", "a doubling array", "an array expanded 300 times", "5,000 nested defaults"],
)
def test_an_expansion_that_explodes_is_refused_not_followed(tmp_path, body, words):
    """bash's billion laughs: a variable or an array that doubles itself 40 times is 2^40 long. The reader
    followed it (diagnose never returned); it now stops at a bound with a coded error, as YAML's does."""
    with pytest.raises(GrpoTuneError) as exc:
        run(tmp_path, HEAD + body)
    assert exc.value.code == "BAD_CONFIG" and words in exc.value.message, exc.value.message
