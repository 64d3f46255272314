"""Regression tests for issue 14 (hostile and careless input): injection into emitted scripts (#1),
lost files (#2), hangs (#3, search), tracebacks (#4) and silently accepted nonsense (#8). Each test
failed before its fix; the CLI runs in-process (cli.main.main), scripts run under bash only with a
printf or fake binaries standing in for every real program."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tune.frameworks.verl.export import verl_overrides, verl_script
from grpo_tune.cli.main import main as cli_main
from grpo_tune.core import tomlwrite
from grpo_tune.core.config import save
from grpo_tune.core.errors import ConfigError, GrpoTuneError
from grpo_tune.trainer.launch import slurm_script
from grpo_tune.core.ranks import RankLayout
from _export_configs import configs
from _hostile import within

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="needs bash")

# Printable text of any script: quotes, $(...), backticks, braces, globs, spaces, unicode.
names = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40)


def _bash_words(script: str, tmp: Path) -> list[str]:
    """The words bash hands to the verl command, with ``printf`` in its place; PATH holds nothing, so no
    external program can run, and the working folder is a scratch one."""
    empty = tmp / "emptybin"
    empty.mkdir(exist_ok=True)
    body = script.replace("python3 -m verl.trainer.main_ppo", "printf '%s\\0'")
    out = subprocess.run(
        [BASH, "-c", body], capture_output=True, timeout=20, cwd=tmp, env={"PATH": str(empty), "HOME": "/home/u"}
    )
    assert out.returncode == 0, out.stderr
    return [w.decode() for w in out.stdout.split(b"\0")[:-1]]


# --- 1. injection -------------------------------------------------------------------------------


@needs_bash
@settings(max_examples=60, deadline=None)
@given(name=names, hf_id=names)
def test_bash_sees_the_model_name_and_hf_id_exactly(tmp_path_factory, name, hf_id):
    tmp = tmp_path_factory.mktemp("sh")
    cfg = configs()["7b-tp2"]
    cfg = cfg.replace(model=dataclasses.replace(cfg.model, name=name, hf_id=hf_id))
    words = _bash_words(verl_script(cfg), tmp)
    assert f"actor_rollout_ref.model.path={hf_id}" in words
    assert f"trainer.experiment_name={name}-{cfg.cluster.gpus}gpu" in words
    assert list(tmp.iterdir()) == [tmp / "emptybin"]  # nothing was written by the script


@needs_bash
def test_the_known_payloads_stay_data(tmp_path):
    cfg = configs()["7b-tp2"]
    cfg = cfg.replace(model=dataclasses.replace(cfg.model, name="$(touch pwned)", hf_id="Qwen/x}$(touch pwned)"))
    words = _bash_words(verl_script(cfg), tmp_path)
    assert "actor_rollout_ref.model.path=Qwen/x}$(touch pwned)" in words
    assert not (tmp_path / "pwned").exists()


def test_control_characters_in_names_are_refused():
    cfg = configs()["7b-tp2"]
    for bad in ("a\nrm -rf ~", "x\ry", "tab\tname", "nul\x00"):
        with pytest.raises(GrpoTuneError):
            verl_script(cfg.replace(hardware=dataclasses.replace(cfg.hardware, name=bad)))
        with pytest.raises(GrpoTuneError):
            verl_script(cfg.replace(model=dataclasses.replace(cfg.model, name=bad)))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=20), max_size=4))
def test_the_toml_writer_round_trips_any_string(name, table):
    data = {"name": name, "x": 1.5, "efficiency": table}
    assert tomllib.loads(tomlwrite.dumps(data, comments=[name])) == data


def _fake_slurm_bin(tmp: Path) -> Path:
    """srun runs its command once as node 0; scontrol names one host; python records its argv."""
    b = tmp / "bin"
    b.mkdir()
    (b / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    (b / "scontrol").write_text("#!/bin/bash\necho node0\n")
    (b / "python").write_text(
        f"#!{shutil.which('python3') or 'python3'}\nimport json, os, sys\n"
        f"json.dump([sys.argv[1:], os.environ.get('PET_NODE_RANK')], "
        f"open({str(tmp / 'argv.json')!r}, 'w'))\n"
    )
    for f in b.iterdir():
        f.chmod(0o755)
    return b


@needs_bash
def test_slurm_passes_hostile_paths_as_exact_arguments(tmp_path):
    b = _fake_slurm_bin(tmp_path)
    config = tmp_path / "my configs" / "it's $(touch X).yaml"
    out = "'$(touch X)'"
    script = slurm_script(
        config, RankLayout(world_size=8, nnodes=2, nproc_per_node=4), worker_args=["--steps", "5", "--out", out]
    )
    (tmp_path / "job.sbatch").write_text(script)
    env = {"PATH": f"{b}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node[0-1]"}
    subprocess.run([BASH, str(tmp_path / "job.sbatch")], check=True, cwd=tmp_path, env=env, timeout=30)
    argv, rank = json.loads((tmp_path / "argv.json").read_text())
    assert argv[-7:] == ["grpo_tune.trainer.main", "--config", str(config.resolve()), "--steps", "5", "--out", out]
    assert rank == "0" and not (tmp_path / "X").exists()


# --- 2. lost files ------------------------------------------------------------------------------


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def run_config(tmp_path):
    p = tmp_path / "best.yaml"
    save(configs()["7b-tp2"], p)
    return p


@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "--config", "{cfg}", "--json", "{cfg}", "--steps", "1"],
        ["train", "--config", "{cfg}", "--slurm", "{cfg}"],
    ],
)
def test_an_output_never_overwrites_the_input(run_config, capsys, argv):
    before = _digest(run_config)
    rc = cli_main([a.format(cfg=run_config) for a in argv])
    assert rc == 2 and "[BAD_CONFIG]" in capsys.readouterr().err
    assert _digest(run_config) == before


@pytest.mark.parametrize("option", ["--slurm", "--json"])
def test_a_folder_as_output_file_is_a_coded_error(run_config, tmp_path, capsys, option):
    cmd = "train" if option == "--slurm" else "profile"
    rc = cli_main([cmd, "--config", str(run_config), option, str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "[BAD_CONFIG]" in err and "hint:" in err


def test_train_out_that_is_a_file_is_a_coded_error(run_config, tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("keep me")
    assert cli_main(["train", "--config", str(run_config), "--out", str(f), "--dry-run"]) == 2
    assert "[BAD_CONFIG]" in capsys.readouterr().err and f.read_text() == "keep me"


def test_probe_out_into_a_bad_path_fails_before_the_probe(tmp_path, capsys):
    t0 = time.monotonic()
    assert cli_main(["probe-hardware", "--out", str(tmp_path / "no" / "such" / "x.toml")]) == 2
    assert time.monotonic() - t0 < 20  # the probe (torchrun, seconds to minutes) never started
    assert "[BAD_CONFIG]" in capsys.readouterr().err
    assert cli_main(["probe-hardware", "--out", str(tmp_path / "x.toml"), "--name", "a\nb"]) == 2


# --- 3. hangs: search over a billion GPUs ------------------------------------------------------


def test_search_over_a_billion_gpus_answers_quickly(capsys):
    t0 = time.monotonic()
    rc = cli_main(["search", "--model", "qwen2-7b", "--gpus", "1000000000"])
    assert time.monotonic() - t0 < 60  # seconds; the old divisor loop ran for hours
    assert rc in (0, 2)


# --- 4 and 8: coded errors for bad model files -------------------------------------------------

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_attention_heads": 8,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "intermediate_size": 128,
}


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "null",
        "[" * 5000 + "]" * 5000,
        json.dumps({**LLAMA, "num_attention_heads": 0}),
        json.dumps(LLAMA).replace("128", "Infinity"),
        json.dumps({**LLAMA, "num_hidden_layers": 2.7}),
        json.dumps({**LLAMA, "num_hidden_layers": True}),
        json.dumps({**LLAMA, "num_key_value_heads": 0}),
        json.dumps({**LLAMA, "num_attention_heads": 7}),
    ],
)
def test_bad_config_json_is_a_coded_error(tmp_path, capsys, text):
    p = tmp_path / "config.json"
    p.write_text(text)
    assert cli_main(["estimate", "--model", str(p), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("[") and "hint:" in err


def test_binary_and_special_files_as_profiles(tmp_path, capsys):
    b = tmp_path / "bin.toml"
    b.write_bytes(b"\x00\x01\xff binary")
    for argv in (
        ["--model", str(b)],
        ["--model", "qwen2-7b", "--hardware", str(b)],
        ["--model", "qwen2-7b", "--hardware", "/dev/zero"],
    ):
        assert cli_main(["estimate", "--gpus", "8", *argv]) == 2, argv
        assert "hint:" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "1.5", "-0.5"])
def test_efficiency_outside_zero_one_is_refused(tmp_path, capsys, value):
    src = Path(__file__).resolve().parent.parent / "grpo_tune" / "profiles" / "hardware" / "cpu.toml"
    text = src.read_text()
    assert "\ncomm_efficiency = " in text
    lines = [f"comm_efficiency = {value}" if ln.startswith("comm_efficiency =") else ln for ln in text.splitlines()]
    p = tmp_path / "hw.toml"
    p.write_text("\n".join(lines) + "\n")
    assert cli_main(["estimate", "--model", "tiny", "--gpus", "2", "--hardware", str(p)]) == 2
    assert "[BAD_CONFIG]" in capsys.readouterr().err


def test_estimate_on_the_cpu_profile_prints_its_table(capsys):
    # (tiny holds 256 positions: the default 1024 + 1024 tokens are refused like train refuses them)
    assert cli_main("estimate --model tiny --gpus 2 --hardware cpu --prompt-len 64 --response-len 64".split()) == 0


def test_override_list_round_trip_keeps_hostile_model_path():
    cfg = configs()["7b-tp2"]
    ov = verl_overrides(cfg, model_path="a b'c\"$(d)")
    assert "actor_rollout_ref.model.path=a b'c\"$(d)" in ov
    assert os.sep  # the list itself is data; verl.sh quotes it (test above)


# --- 5 and 6: datasets and rewards checked before any process starts ---------------------------


def _preflight(tmp_path, **trainer):
    from grpo_tune.trainer import launch

    cfg = configs()["7b-tp2"]
    cfg = cfg.replace(trainer=dataclasses.replace(cfg.trainer, out_dir=str(tmp_path / "run"), **trainer))
    return launch.preflight(cfg, need_torch=False)


@pytest.mark.parametrize(
    "name,content,code",
    [
        ("bad.jsonl", b'{"prompt": "1+1", "answer": "2"}\n{not json\n', "BAD_CONFIG"),
        ("empty.jsonl", b"", "BAD_CONFIG"),
        ("noprompt.jsonl", b'{"text": "1+1", "answer": "2"}\n', "BAD_CONFIG"),
        ("data.csv", b"prompt,answer\n1+1,2\n", "BAD_CONFIG"),
        ("binary.jsonl", b"\xff\xfe\x00\x01" * 64, "BAD_CONFIG"),
        (None, "synthetic:banana", "BAD_CONFIG"),
    ],
)
def test_malformed_datasets_fail_the_pre_start_check(tmp_path, name, content, code):
    if name is None:
        spec = content
    else:
        (tmp_path / name).write_bytes(content)
        spec = str(tmp_path / name)
    with pytest.raises(GrpoTuneError) as exc:
        _preflight(tmp_path, dataset=spec)
    assert exc.value.code == code, exc.value.message


@pytest.mark.parametrize("body,fn", [("def f(:\n", "f"), ("x = 1\n", "f"), ("raise RuntimeError('boom')\n", "f")])
def test_broken_reward_modules_fail_the_pre_start_check(tmp_path, body, fn):
    (tmp_path / "rw.py").write_text(body)
    with pytest.raises(GrpoTuneError) as exc:
        _preflight(tmp_path, reward=f"{tmp_path / 'rw.py'}:{fn}")
    assert exc.value.code == "BAD_CONFIG"


def test_documented_reward_forms_are_accepted(tmp_path):
    (tmp_path / "rw.py").write_text("def score(response, answer):\n    return 1.0\n")
    for spec in ("math", "math_format", f"{tmp_path / 'rw.py'}:score"):
        assert _preflight(tmp_path, reward=spec).world_size == 8


REFINED = "measured: {step_s: 1.0}  # a finished refine's result\n"


def _refined_run(tmp_path):
    """A finished refine's run folder (study ``s``) holding only its best.yaml."""
    run_dir = tmp_path / "runs" / "s"
    run_dir.mkdir(parents=True)
    (run_dir / "best.yaml").write_text(REFINED)
    return run_dir


def _refine_again(tmp_path, *extra):
    base = ["search", "--model", "qwen2-7b", "--gpus", "8", "--refine"]
    return cli_main([*base, *extra, "--out", str(tmp_path / "runs"), "--study-name", "s"])


def test_a_bad_refine_option_leaves_the_refined_run_folder_alone(tmp_path, capsys):
    run_dir = _refined_run(tmp_path)
    rc = _refine_again(tmp_path, "--trials", "0")
    assert rc == 2 and "[BAD_CONFIG]" in capsys.readouterr().err
    assert (run_dir / "best.yaml").read_text() == REFINED
    assert sorted(p.name for p in run_dir.iterdir()) == ["best.yaml"]


@pytest.mark.parametrize("content", ["[" * 3000 + "]" * 3000, "a: " + "{b: " * 500 + "1" + "}" * 500])
def test_deep_yaml_run_config_is_a_coded_error(tmp_path, capsys, content):
    p = tmp_path / "deep.yaml"
    p.write_text(content)
    t0 = time.monotonic()
    assert cli_main(["train", "--config", str(p), "--dry-run"]) == 2
    assert time.monotonic() - t0 < 30 and "[BAD_CONFIG]" in capsys.readouterr().err


def test_a_fifo_run_config_is_refused_unread(tmp_path, capsys):
    p = tmp_path / "fifo.yaml"
    os.mkfifo(p)
    assert cli_main(["train", "--config", str(p), "--dry-run"]) == 2  # it used to block forever in read_text
    assert "regular file" in capsys.readouterr().err


def test_probe_refuses_a_billion_ranks_before_starting(tmp_path, capsys):
    t0 = time.monotonic()
    assert cli_main(["probe-hardware", "--out", str(tmp_path / "x.toml"), "--nproc", "1000000000"]) == 2
    assert time.monotonic() - t0 < 20 and "[BAD_CONFIG]" in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()


def test_a_bad_storage_url_leaves_the_refined_run_folder_alone(tmp_path, capsys):
    run_dir = _refined_run(tmp_path)
    rc = _refine_again(tmp_path, "--storage", "nosuchdb://x/y")
    err = capsys.readouterr().err
    assert rc == 2 and "[BAD_CONFIG]" in err and "hint:" in err
    assert (run_dir / "best.yaml").read_text() == REFINED
    assert sorted(p.name for p in run_dir.iterdir()) == ["best.yaml"]


def test_a_good_refine_rerun_keeps_the_refined_best_until_refine_replaces_it(tmp_path, capsys, monkeypatch):
    from grpo_tune import autotune

    best = _refined_run(tmp_path) / "best.yaml"
    seen = []

    def dies_at_start(*a, **k):  # the resumed study fails before any trial: nothing may have been replaced
        seen.append(best.read_text())
        raise ConfigError("study cannot be opened")

    monkeypatch.setattr(autotune.refine, "refine", dies_at_start)
    rc = _refine_again(tmp_path, "--json")
    assert rc == 2 and seen == [REFINED]
    assert best.read_text() == REFINED


def test_probe_nproc_zero_is_an_error_not_the_default(tmp_path, capsys):
    rc = cli_main(["probe-hardware", "--nproc", "0", "--out", str(tmp_path / "p.toml")])
    err = capsys.readouterr().err
    assert rc == 2 and "[BAD_CONFIG]" in err and "--nproc must be >= 1" in err and "hint:" in err
    assert not (tmp_path / "p.toml").exists()


# --- found again on 2026-11-30's main (issue 14 re-verification); each failed before its fix ---------------

VERL_LOGS = Path(__file__).resolve().parent / "fixtures" / "verl_logs"


def _coded(capsys, rc: int) -> str:
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("[") and "hint:" in err and "Traceback" not in err, (rc, err)
    return err


def test_diagnose_command_prints_a_200k_line_script_in_bounded_time(tmp_path, capsys):
    """The reader was linear (test_diagnose_shell), but the command drew one rich table row per finding:
    200k unknown keys took minutes to print. The table now shows the first rows; --json has them all."""
    p = tmp_path / "long.sh"
    body = "".join(f" +t.x{i}=1 \\\n" for i in range(200_000))
    p.write_text("#!/bin/bash\npython3 -m verl.trainer.main_ppo \\\n" + body + " data.train_batch_size=64\n")
    t0 = time.monotonic()
    with within(300):
        rc = cli_main(["diagnose", str(p)])
    assert time.monotonic() - t0 < 60  # seconds; it took ~140 s unloaded before
    out = capsys.readouterr().out
    warnings = re.search(r"(\d+) warning\(s\)", out)
    assert rc == 1 and warnings and int(warnings[1]) >= 200_000 and "more finding(s) not shown" in out


@pytest.mark.parametrize("which", ["log", "launch"])
def test_calibrate_out_never_overwrites_its_log_or_launch(tmp_path, capsys, which):
    log, launch = tmp_path / "run_a.jsonl", tmp_path / "launch_a.txt"
    shutil.copy(VERL_LOGS / log.name, log)
    shutil.copy(VERL_LOGS / launch.name, launch)
    before = (_digest(log), _digest(launch))
    out = log if which == "log" else launch
    rc = cli_main(["calibrate", "--from-log", str(log), "--launch", str(launch), "--out", str(out)])
    assert "also an input" in _coded(capsys, rc)
    assert (_digest(log), _digest(launch)) == before


def test_calibrate_out_into_a_folder_is_refused_before_the_fit(tmp_path, capsys):
    rc = cli_main(
        ["calibrate", "--from-log", str(VERL_LOGS / "run_a.jsonl"), "--launch", str(VERL_LOGS / "launch_a.txt")]
        + ["--out", str(tmp_path)]
    )
    assert "[BAD_CONFIG] --out" in _coded(capsys, rc)  # it used to name a temp file: IO_ERROR .x.tmp


def test_probe_out_is_never_its_own_base(tmp_path, capsys):
    base = tmp_path / "mine.toml"
    shutil.copy(Path(__file__).resolve().parent.parent / "grpo_tune" / "profiles" / "hardware" / "cpu.toml", base)
    before = _digest(base)
    t0 = time.monotonic()
    rc = cli_main(["probe-hardware", "--out", str(base), "--base", str(base), "--quick", "--nproc", "1"])
    assert "also an input" in _coded(capsys, rc)
    assert time.monotonic() - t0 < 20 and _digest(base) == before  # refused before the probe ran


def _cli_subprocess(argv: list[str], timeout_s: float = 60, mem_bytes: int = 2 << 30) -> tuple[int, str]:
    """The console script in a child with 2 GiB of address space and a timeout: a read of /dev/zero or of a
    FIFO that never ends (what these tests catch) cannot eat the machine's memory or hang the suite."""
    import resource
    import sys

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    try:
        out = subprocess.run(
            [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            preexec_fn=cap,
        )
    except subprocess.TimeoutExpired:
        return -1, f"still running after {timeout_s} s"
    return out.returncode, out.stderr


def _special_files(tmp_path) -> tuple[list[Path], list[Path]]:
    """(files that hung: /dev/zero, a FIFO), (files that gave tracebacks: deep nesting, binary)."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    binary = tmp_path / "binary.json"
    binary.write_bytes(bytes(range(256)) * 8)
    return [Path("/dev/zero"), fifo], [deep, binary]


def _coded_child(rc: int, err: str) -> None:
    assert rc == 2 and err.startswith("[") and "hint:" in err and "Traceback" not in err, (rc, err)


def test_a_calibration_file_that_never_ends_is_refused_unread(tmp_path):
    """/dev/zero grew without limit and a FIFO blocked forever (estimate, search, compare and tune share the reader)."""
    for f in _special_files(tmp_path)[0]:
        _coded_child(*_cli_subprocess(["estimate", "--model", "qwen2-7b", "--calibration", str(f)]))


@pytest.mark.parametrize("cmd", ["estimate", "search", "compare"])
def test_a_deep_or_binary_calibration_file_is_a_coded_error(tmp_path, capsys, cmd):
    """Deep nesting was INTERNAL_ERROR (RecursionError)."""
    for f in _special_files(tmp_path)[1]:
        _coded(capsys, cli_main([cmd, "--model", "qwen2-7b", "--gpus", "8", "--calibration", str(f)]))


def test_validate_grpo_reads_only_a_bounded_text_file(tmp_path, capsys):
    """/dev/zero and a FIFO hung; a binary file was INTERNAL_ERROR (UnicodeDecodeError), a deep one (csv's
    field limit) too."""
    hang, bad = _special_files(tmp_path)
    for f in hang:
        _coded_child(*_cli_subprocess(["validate", "--grpo", "--data", str(f)]))
    for f in bad:
        _coded(capsys, cli_main(["validate", "--grpo", "--data", str(f)]))


@pytest.mark.parametrize(
    "key,value",
    [("num_hidden_layers", 10**23), ("num_hidden_layers", 10**9), ("hidden_size", 2**70), ("vocab_size", 10**30)],
)
def test_absurd_model_sizes_are_refused_not_looped_over(tmp_path, capsys, key, value):
    """10**23 layers made the parameter count loop over every layer (a hang); sizes have a ceiling now."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**LLAMA, key: value}))
    t0 = time.monotonic()
    with within(60):
        rc = cli_main(["estimate", "--model", str(p), "--gpus", "8", "--prompt-len", "64", "--response-len", "64"])
    assert "[BAD_CONFIG]" in _coded(capsys, rc) and time.monotonic() - t0 < 20


QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "hidden_size": 64,
    "head_dim": 8,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
}


@pytest.mark.parametrize(
    "patch",
    [
        {"num_experts": 7.9},
        {"num_experts": True},
        {"num_experts_per_tok": "2"},
        {"moe_intermediate_size": 31.5},
        {"tie_word_embeddings": "false"},  # bool("false") is True: a tied model nobody asked for
        {"attention_bias": 1},
    ],
)
def test_moe_and_flag_fields_of_config_json_are_not_coerced(tmp_path, capsys, patch):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**QWEN3_MOE, **patch}))
    rc = cli_main(["estimate", "--model", str(p), "--gpus", "8", "--prompt-len", "64", "--response-len", "64"])
    assert "[BAD_CONFIG]" in _coded(capsys, rc)


def test_the_moe_config_json_above_is_valid(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(QWEN3_MOE))
    assert cli_main(["estimate", "--model", str(p), "--gpus", "8", "--prompt-len", "64", "--response-len", "64"]) == 0


def test_one_bad_file_in_grpo_tune_profiles_breaks_only_itself(tmp_path, capsys, monkeypatch):
    extra = tmp_path / "profiles"
    (extra / "models").mkdir(parents=True)
    (extra / "hardware").mkdir()
    (extra / "models" / "broken.toml").write_bytes(b"\x00\xff binary")
    (extra / "hardware" / "half.toml").write_text("name = 'half'\nhbm_bytes = [\n")
    monkeypatch.setenv("GRPO_TUNE_PROFILES", str(extra))
    for i, argv in enumerate(
        (
            ["estimate", "--model", "qwen2-7b", "--gpus", "8"],
            ["estimate", "--model", "Qwen/Qwen2-7B-Instruct", "--gpus", "8"],
            ["models"],
            ["hardware"],
        )
    ):
        assert cli_main(argv) == 0, argv
        if i == 0:  # said on stderr (once per process), not silently dropped
            err = capsys.readouterr().err
            assert "warning: skipped" in err and "broken.toml" in err and "half.toml" in err, err
    for argv in (["estimate", "--model", "broken"], ["estimate", "--model", "qwen2-7b", "--hardware", "half"]):
        err = _coded(capsys, cli_main(argv))
        assert "broken.toml" in err or "half.toml" in err, err


def test_a_name_refused_at_emit_leaves_no_half_written_run_folder(tmp_path, capsys):
    """The hardware name's newline was refused while writing verl.sh, after best.yaml was written."""
    hw = tmp_path / "hw.toml"
    text = (Path(__file__).resolve().parent.parent / "grpo_tune" / "profiles" / "hardware" / "cpu.toml").read_text()
    hw.write_text(text.replace('name = "cpu"', 'name = "cpu\\nrm -rf ~"', 1))
    runs = tmp_path / "runs"
    argv = ["search", "--model", "tiny", "--gpus", "2", "--hardware", str(hw), "--prompt-len", "64"]
    rc = cli_main([*argv, "--response-len", "64", "--out", str(runs)])
    assert "control character" in _coded(capsys, rc)
    assert not runs.exists() or list(runs.iterdir()) == []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_trial_timeout_must_be_a_finite_positive_number(value):
    from grpo_tune.autotune.refine.loop import RefineOptions

    with pytest.raises(ConfigError, match="--trial-timeout"):
        RefineOptions(trial_timeout_s=value).check()


def _grpo_csv(tmp_path, split: str, **cells: str) -> Path:
    """The shipped published-GRPO table with its first row's split and ``cells`` replaced."""
    import csv
    import io

    from grpo_tune.validate.grpo import GRPO_DATA_PATH

    lines = GRPO_DATA_PATH.read_text().splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))
    cols = next(csv.reader([lines[head]]))
    row = next(csv.reader([lines[head + 1]]))
    for k, v in {"split": split, **cells}.items():
        row[cols.index(k)] = v
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(row)
    p = tmp_path / "grpo.csv"
    p.write_text("\n".join(lines[: head + 1]) + "\n" + buf.getvalue())
    return p


@pytest.mark.parametrize(
    "split,cells",
    [
        ("excluded", {}),  # no scored row: the report printed None with :.1f (INTERNAL_ERROR)
        ("holdout", {"gpus": "inf"}),  # OverflowError in int(float(...))
        ("holdout", {"tp": "2.5"}),  # was floored to 2
        ("holdout", {"step_s": "inf"}),  # passed `> 0`
    ],
)
def test_validate_grpo_bad_rows_are_coded_errors(tmp_path, capsys, split, cells):
    data = _grpo_csv(tmp_path, split, **cells)
    assert "[BAD_CONFIG]" in _coded(capsys, cli_main(["validate", "--grpo", "--data", str(data)]))


def test_validate_grpo_one_good_held_out_row_scores(tmp_path):
    assert cli_main(["validate", "--grpo", "--data", str(_grpo_csv(tmp_path, "holdout")), "--tolerance", "1000"]) == 0


def test_deeply_nested_json_lines_are_not_records(tmp_path, capsys):
    """--lengths and calibrate --from-log read JSON lines; a line of 5,000 brackets was INTERNAL_ERROR
    (RecursionError), found by tests/test_fuzz_cli.py."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"a": ' + "[" * 5000 + "]" * 5000 + "}\n")
    rc = cli_main(["estimate", "--model", "qwen2-7b", "--lengths", str(deep)])
    _coded(capsys, rc)
    rc = cli_main(["calibrate", "--from-log", str(deep), "--launch", str(VERL_LOGS / "launch_a.txt")])
    _coded(capsys, rc)


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "--model", "tiny", "--gpus", "2", "--hardware", "cpu", "--prompt-len", "64", "--response-len", "64"],
        [
            "compare",
            "--model",
            "tiny",
            "--gpus",
            "2",
            "--hardware",
            "cpu",
            "--prompt-len",
            "64",
            "--response-len",
            "64",
        ],
        ["tune", str(VERL_LOGS / "launch_a.txt")],
    ],
)
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_out_that_cannot_be_a_folder_is_refused_before_the_search(tmp_path, capsys, argv, where):
    """It was IO_ERROR 'File exists' (or a temp file's name) after the whole search ran."""
    f = tmp_path / "afile"
    f.write_text("keep me")
    out = f if where == "a file" else f / "runs"
    assert "[BAD_CONFIG] --out" in _coded(capsys, cli_main([*argv, "--out", str(out)]))
    assert f.read_text() == "keep me"


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "", "a\nb", "a\\b"])
def test_study_name_is_one_folder_name(name):
    """It names the run folder under --out: '../../x' wrote a refine run outside --out, and started it."""
    from grpo_tune.autotune.refine.loop import RefineOptions

    with pytest.raises(ConfigError, match="--study-name"):
        RefineOptions(study_name=name).check()
    RefineOptions(study_name="qwen7b-8gpu v2").check()


_TERM_CHILD = """
import os, sys
from pathlib import Path
import grpo_tune.cli.main as M
from grpo_tune.autotune.refine.runner import run_profile

tmp = Path(sys.argv[1])
code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
sleeper = [sys.executable, "-c", code, str(tmp / "trial.pid")]

def app(**kw):  # the CLI, reduced to one refine trial that runs for minutes
    run_profile(tmp / "c.yaml", steps=2, timeout_s=600, json_path=tmp / "p.json", log_path=tmp / "p.log",
                profile_cmd=sleeper)

M.app = app
sys.exit(M.main([]))
"""


def test_sigterm_takes_a_running_trial_down_with_the_cli(tmp_path):
    """`timeout`/kill of `grpo-tune search --refine` left its trial (its own session) running: SIGTERM ended
    Python without unwinding, so the runner's cleanup never ran."""
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    cli = subprocess.Popen([sys.executable, "-c", _TERM_CHILD, str(tmp_path)], env=env)
    pid_file = tmp_path / "trial.pid"
    t0 = time.monotonic()
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    trial = int(pid_file.read_text())
    cli.terminate()
    rc = cli.wait(timeout=30)
    deadline = time.monotonic() + 10
    alive = True
    while alive and time.monotonic() < deadline:
        try:
            os.kill(trial, 0)
            time.sleep(0.1)
        except ProcessLookupError:
            alive = False
    if alive:
        os.kill(trial, signal.SIGKILL)  # do not leave it behind when the test fails
    assert not alive and rc == 128 + signal.SIGTERM


# --- bullets of defect 8 that only the fuzz suite or the estimate command covered ------------------------

M7 = ["--model", "qwen2-7b", "--gpus", "8", "--hardware", "h100"]


@pytest.mark.parametrize("cmd", ["estimate", "search", "compare"])
@pytest.mark.parametrize("gmu", ["0", "1.5", "nan", "-0.5", "inf"])
def test_gpu_memory_utilization_outside_zero_one_is_refused(capsys, cmd, gmu):
    """search gave a self-contradicting NO_FEASIBLE_PLAN and compare exited 0 with nothing fitting."""
    rc = cli_main([cmd, *M7, f"--gpu-memory-utilization={gmu}"])
    assert "--gpu-memory-utilization" in _coded(capsys, rc)


@pytest.mark.parametrize("cmd", ["estimate", "search"])
@pytest.mark.parametrize(
    "flags,says",
    [
        (["--mini-batch", "16", "--prompts", "8"], "--mini-batch 16 exceeds --prompts 8"),  # silently became 8
        (["--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),  # meant "the profile's"
        (["--gpus-per-node", "-1"], "--gpus-per-node must be >= 1"),
    ],
)
def test_flags_that_were_silently_rewritten_are_refused(capsys, cmd, flags, says):
    assert says in _coded(capsys, cli_main([cmd, *M7, *flags]))


@pytest.mark.parametrize("where", ["top", "efficiency"])
def test_unknown_keys_in_a_hardware_file_are_refused(tmp_path, capsys, where):
    text = (Path(__file__).resolve().parent.parent / "grpo_tune" / "profiles" / "hardware" / "cpu.toml").read_text()
    text = "hbm_gb = 24\n" + text if where == "top" else text.replace("[efficiency]\n", "[efficiency]\nmfu = 0.5\n")
    (tmp_path / "hw.toml").write_text(text)
    rc = cli_main(["estimate", "--model", "tiny", "--gpus", "2", "--hardware", str(tmp_path / "hw.toml")])
    assert "[UNKNOWN_KEY]" in _coded(capsys, rc)


@pytest.mark.parametrize("key", ["comm_efficiency", "hbm_efficiency"])
@pytest.mark.parametrize("value", ["0", "-0.5", "1.5", "nan", "inf"])
def test_any_efficiency_outside_zero_one_is_refused(tmp_path, capsys, key, value):
    """comm/hbm efficiency 0 divided by zero (a traceback); below 0 or above 1 gave negative times and MFU > 1."""
    text = (Path(__file__).resolve().parent.parent / "grpo_tune" / "profiles" / "hardware" / "cpu.toml").read_text()
    assert f"\n{key} = " in text
    lines = [f"{key} = {value}" if ln.startswith(f"{key} =") else ln for ln in text.splitlines()]
    (tmp_path / "hw.toml").write_text("\n".join(lines) + "\n")
    rc = cli_main(["estimate", "--model", "tiny", "--gpus", "2", "--hardware", str(tmp_path / "hw.toml")])
    assert "[BAD_CONFIG]" in _coded(capsys, rc)


def test_python_requirement_matches_tomllib():
    """core/specs.py imports tomllib (3.11+); pyproject said >= 3.10, so every command died at import on 3.10."""
    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    uses_tomllib = any("import tomllib" in p.read_text() for p in root.glob("*/*.py") if p.parts[-2] != "tests")
    tomli_fallback = any(d.startswith("tomli") for d in project.get("dependencies", []))
    assert not uses_tomllib or tomli_fallback or project["requires-python"].replace(" ", "") in (">=3.11", ">=3.12")


def test_the_probe_writer_keeps_a_hostile_name_exact(tmp_path):
    from grpo_tune.trainer.probe import write_profile

    name = 'x" = 1 #\\ [efficiency] \u202e'
    write_profile(tmp_path / "p.toml", name=name, base={}, fields={}, efficiency={}, source="s", comments=[name])
    assert tomllib.loads((tmp_path / "p.toml").read_text())["name"] == name


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--master-port", "99999", "--master-addr", "node0"], "--master-port must be a TCP port"),
        (["--master-port", "0", "--master-addr", "node0"], "--master-port must be a TCP port"),
        (["--master-addr", "a\nb"], "is not a host name"),
        (["--master-addr", "a b"], "is not a host name"),
    ],
)
def test_rendezvous_flags_are_checked_before_torchrun(run_config, tmp_path, capsys, flags, says):
    """--dry-run accepted them; torchrun failed on them only after the launch (train and profile)."""
    rc = cli_main(["train", "--config", str(run_config), "--nnodes", "2", "--dry-run", *flags])
    assert says in _coded(capsys, rc)
    rc = cli_main(["profile", "--config", str(run_config), "--json", str(tmp_path / "p.json"), *flags])
    assert says in _coded(capsys, rc)
    assert cli_main(["train", "--config", str(run_config), "--nnodes", "2", "--dry-run", "--master-addr", "node0"]) == 0


def _hf_folder(tmp_path, weights: bytes | None, tokenizer: bool = True) -> Path:
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    if weights is not None:
        (d / "model.safetensors").write_bytes(weights)
    return d


def _safetensors(header: dict, data: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + data


@pytest.mark.parametrize(
    "weights,tokenizer,code",
    [
        (_safetensors({}), False, "BAD_CONFIG"),  # no tokenizer.json
        (None, True, "CHECKPOINT_ERROR"),  # no weights
        (b"garbage", True, "CHECKPOINT_ERROR"),
        ((2**63 - 1).to_bytes(8, "little") + b"{", True, "CHECKPOINT_ERROR"),  # a header longer than the file
        (
            _safetensors({"w": {"dtype": "F32", "shape": [10**12], "data_offsets": [0, 4 * 10**12]}}),
            True,
            "CHECKPOINT_ERROR",
        ),
        (_safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": "x"}}), True, "CHECKPOINT_ERROR"),
    ],
)
def test_a_broken_hf_checkpoint_fails_the_pre_start_check(tmp_path, weights, tokenizer, code):
    """Each passed `train --dry-run` and failed in the workers: exit 4 with torch's ChildFailedError."""
    hf = _hf_folder(tmp_path, weights, tokenizer)
    with pytest.raises(GrpoTuneError) as exc:
        _preflight(tmp_path, hf_checkpoint=str(hf))
    assert exc.value.code == code, exc.value.message


def test_a_sound_hf_checkpoint_header_passes_the_pre_start_check(tmp_path):
    hf = _hf_folder(tmp_path, _safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)))
    assert _preflight(tmp_path, hf_checkpoint=str(hf)).world_size == 8


def test_lengths_from_a_file_without_newlines_is_read_in_bounded_memory(tmp_path, capsys):
    """--lengths read each line whole: a weights file given by mistake (no newlines) took ~2x its size in RSS.
    Lines over MAX_LINE_CHARS are now skipped in bounded pieces. Measured here on a 200 MiB file: max RSS 450 MB
    before (MemoryError under a 400 MB address-space cap), 57 MB after (runs under 150 MB); the child gets 320 MiB."""
    from grpo_tune.autotune.calibrate.lengths import MAX_LINE_CHARS

    big = tmp_path / "model.safetensors"
    with open(big, "wb") as fh:
        for _ in range(200):
            fh.write(b"x" * (1 << 20))
    rc, err = _cli_subprocess(["estimate", "--model", "qwen2-7b", "--lengths", str(big)], 120, mem_bytes=320 << 20)
    assert rc == 2 and "has no prompts or length metrics" in err, (rc, err[-500:])
    ok = tmp_path / "ok.jsonl"  # a normal dataset beside an over-long line still gives its lengths
    ok.write_text('{"prompt": "' + "y" * MAX_LINE_CHARS + '"}\n' + '{"prompt": "what is 1+1?"}\n' * 3)
    assert cli_main(["estimate", "--model", "qwen2-7b", "--lengths", str(ok), "--json"]) == 0
    assert "3 prompts" in capsys.readouterr().out


# --- leftovers of the re-verification (notes/hostile14.md "Noticed, left alone") ----------------


def _calibrate(log: Path, *extra: str, out: Path) -> list[str]:
    return ["calibrate", "--from-log", str(log), "--launch", str(VERL_LOGS / "launch_a.txt"), "--out", str(out), *extra]


@pytest.mark.parametrize("warmup", ["99999999999999999999", "12"])
def test_calibrate_warmup_that_drops_every_step_is_refused(tmp_path, capsys, warmup):
    """run_a logs 12 training steps. It warned "warm-up steps kept" and then printed "12 steps after dropping
    99999999999999999999 warm-up step(s)": both cannot be true."""
    rc = cli_main(_calibrate(VERL_LOGS / "run_a.jsonl", "--warmup", warmup, out=tmp_path / "c.json"))
    err = _coded(capsys, rc)
    assert f"[BAD_CONFIG] --warmup {warmup} drops every step of" in err and "12 training step(s)" in err
    assert not (tmp_path / "c.json").exists()


def test_calibrate_one_step_log_needs_warmup_zero(tmp_path, capsys):
    """A one-step log kept its step under the default --warmup 1 (a warning) and printed "after dropping 1
    warm-up step(s)": it was fitted to the warm-up step. Now it is refused; --warmup 0 keeps it, and says so."""
    one = tmp_path / "one.jsonl"  # step 0 is validation only; step 1 is the one training step
    one.write_text("".join((VERL_LOGS / "run_a.jsonl").read_text().splitlines(keepends=True)[:2]))
    err = _coded(capsys, cli_main(_calibrate(one, out=tmp_path / "c.json")))
    assert "--warmup 1 drops every step of" in err and "--warmup 0 keeps every step" in err
    assert cli_main(_calibrate(one, "--warmup", "0", out=tmp_path / "c.json")) == 0
    assert "1 steps after dropping 0 warm-up step(s) per log" in capsys.readouterr().out


@pytest.mark.parametrize("params", [",", " , ,", "", "no_such_knob", "compute_efficiency_scale,bogus"])
def test_calibrate_params_must_name_known_knobs(tmp_path, capsys, params):
    """`--params ,` fitted every knob; an unknown name was refused only after every log was read."""
    rc = cli_main(_calibrate(VERL_LOGS / "run_a.jsonl", "--params", params, out=tmp_path / "c.json"))
    err = _coded(capsys, rc)
    assert "[BAD_CONFIG] --params" in err and "compute_efficiency_scale" in err.split("hint:")[1]
    assert not (tmp_path / "c.json").exists()


def _with_timings(tmp_path, name: str, steps: set[int], keys: tuple[str, ...] = (), value=float("nan")) -> Path:
    """run_a.jsonl with ``value`` in the timing keys ``keys`` (all of them when empty) of ``steps``."""
    lines = []
    for line in (VERL_LOGS / "run_a.jsonl").read_text().splitlines():
        obj = json.loads(line)
        if obj["step"] in steps:
            for k in obj["data"]:
                if k.startswith("timing_s/") and (not keys or k in keys):
                    obj["data"][k] = value
        lines.append(json.dumps(obj))  # NaN and Infinity as Python's json (and verl's file logger) write them
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nan_timing_in_a_log_is_warned_not_silently_dropped(tmp_path, capsys, value):
    log = _with_timings(tmp_path, "nan.jsonl", {5}, value=value)  # every timer of step 5, one of step 6
    text = log.read_text()
    one = _with_timings(tmp_path, "one.jsonl", {6}, ("timing_s/gen",), value)
    log.write_text(text.replace(text.splitlines()[6], one.read_text().splitlines()[6]))
    rc = cli_main(_calibrate(log, out=tmp_path / "c.json"))
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "step 5: timing_s/gen, " in cap.err and "NaN or infinite; the step is skipped" in cap.err, cap.err
    assert "step 6: timing_s/gen is NaN or infinite; left out of that step" in cap.err, cap.err
    assert "10 steps after dropping 1 warm-up step(s)" in cap.out


def test_a_log_whose_every_timing_is_nan_is_refused(tmp_path, capsys):
    log = _with_timings(tmp_path, "allnan.jsonl", set(range(100)))
    err = _coded(capsys, cli_main(_calibrate(log, out=tmp_path / "c.json")))
    assert "every step with timings has a NaN or infinite one (12 step(s)" in err


def test_a_nan_timing_in_a_console_log_is_warned(tmp_path):
    from grpo_tune.autotune.calibrate.runlog import read_log

    lines = (VERL_LOGS / "run_a.console.log").read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if "step:3 " in line and "timing_s/gen:" in line)
    lines[i] = re.sub(r"timing_s/gen:[^ ]+", "timing_s/gen:nan", lines[i])
    p = tmp_path / "nan.console.log"
    p.write_text("".join(lines))
    log = read_log(p)
    assert any("step 3: timing_s/gen is NaN or infinite" in w for w in log.warnings), log.warnings
    rec = next(r for r in log.records if r.step == 3)
    assert "rollout" not in rec.phases_s and "update" in rec.phases_s  # only the broken timer is left out


def test_search_top_is_bounded(capsys):
    """--top sized the exact re-evaluation (4 x top): --top 10**20 evaluated every plan, 23 s for 7B on 8 GPUs."""
    t0 = time.monotonic()
    rc = cli_main(["search", "--model", "qwen2-7b", "--gpus", "8", "--top", str(10**20)])
    assert "[BAD_CONFIG] --top must be between 1 and 1000" in _coded(capsys, rc)
    assert time.monotonic() - t0 < 5  # seconds: refused before the search
    tiny = ["search", "--model", "tiny", "--gpus", "2", "--hardware", "cpu", "--prompt-len", "64"]
    assert cli_main([*tiny, "--response-len", "64", "--top", "1000", "--no-emit"]) == 0


def test_pretrain_seq_len_is_checked_against_the_model_positions(capsys):
    """GRPO lengths were checked against max_position_embeddings, pretraining's --seq-len was not: 10**20 gave
    an OOM verdict of 5e17 GiB."""
    base = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--workload", "pretrain"]
    err = _coded(capsys, cli_main([*base, "--seq-len", str(10**20)]))
    assert err.startswith(f"[BAD_CONFIG] seq_len = {10**20} exceeds qwen2.5-7b's max_seq_len 131072\n")
    assert "hint: shorten the sequence length (--seq-len) to at most 131072 tokens" in err
    assert cli_main([*base, "--seq-len", "131072"]) in (0, 1)  # at the limit: priced, not refused


def test_out_colliding_with_an_input_names_that_input(tmp_path, capsys, monkeypatch):
    """`search --calibration runs` (the default --out's name) said only "--out runs is an input"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    err = _coded(capsys, cli_main(["search", "--model", "qwen2-7b", "--gpus", "8", "--calibration", "runs"]))
    assert "[BAD_CONFIG] --out runs (where the run folder would go) is also an input of this command " in err
    assert "(--calibration runs)" in err
    assert "give --out another folder (e.g. --out runs-out)" in err
